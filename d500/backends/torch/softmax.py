"""The softmax family in torch (Softmax, LogSoftmax, Hardmax) and the losses on
log-probabilities (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from d500.backends.graph import registry
from d500.backends.torch.table import axis_of

OPS, op = registry()


def _softmax_like(node, x, fn):
    if node.opset >= 13:
        return fn(x, node.attr("axis", -1))
    axis = axis_of(node.attr("axis", 1), x.dim())
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return fn(flat, 1).reshape(x.shape)


@op
def Softmax(node, x):
    return _softmax_like(node, x, torch.softmax)


@op
def LogSoftmax(node, x):
    return _softmax_like(node, x, torch.log_softmax)


@op
def Hardmax(node, x):
    def hardmax(t, axis):
        return F.one_hot(t.argmax(dim=axis), t.shape[axis]).movedim(-1, axis).to(t.dtype)
    return _softmax_like(node, x, hardmax)


def _nll(node, log_prob, target, weight):
    reduction = node.attr("reduction", "mean")
    ignore = node.attr("ignore_index")
    target = target.to(torch.int64)
    if weight is None and ignore is None:
        return F.nll_loss(log_prob, target, reduction=reduction)  # one fused kernel each way
    valid = target != ignore if ignore is not None else torch.ones_like(target, dtype=torch.bool)
    safe = torch.where(valid, target, 0)
    loss = -log_prob.gather(1, safe.unsqueeze(1)).squeeze(1)
    if weight is not None:
        w = weight[safe] * valid
    elif ignore is not None and ignore != -1:  # (ONNX's reference: -1 is never masked here)
        w = valid.to(log_prob.dtype)
    else:
        w = None
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum() if w is not None else loss.mean()


@op
def NegativeLogLikelihoodLoss(node, x, target, weight=None):
    return _nll(node, x, target, weight)


@op
def SoftmaxCrossEntropyLoss(node, x, target, weight=None):
    log_prob = torch.log_softmax(x, dim=1)
    loss = _nll(node, log_prob, target, weight)
    return (loss, log_prob) if len(node.outputs) > 1 else loss
