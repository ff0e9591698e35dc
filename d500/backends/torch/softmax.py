"""The softmax family in torch (Softmax, LogSoftmax, Hardmax) and the losses on
log-probabilities (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss: the shared `nll`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from d500.backends import nll
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


OPS.update(nll.table(nll.Kit(
    int64=lambda x: x.to(torch.int64), where=torch.where,
    true_like=lambda x: torch.ones_like(x, dtype=torch.bool),
    pick=lambda log_prob, safe: log_prob.gather(1, safe.unsqueeze(1)).squeeze(1),
    cast=lambda x, dtype: x.to(dtype), log_softmax=lambda x, axis: torch.log_softmax(x, axis),
    fused=lambda log_prob, target, reduction: F.nll_loss(log_prob, target, reduction=reduction))))
