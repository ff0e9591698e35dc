"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss written once over a framework's
primitives (its `Kit`): the target classes picked, ignore_index masked, class weights applied and
the reduction taken. A framework takes `table(kit)` into its op table."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Kit:
    """The primitives the loss uses, as one framework provides them."""

    int64: Callable[[Any], Any]
    where: Callable[[Any, Any, Any], Any]
    true_like: Callable[[Any], Any]  # booleans, all true, of x's shape
    pick: Callable[[Any, Any], Any]  # (log_prob [N, C, ...], classes [N, ...]): [N, ...]
    cast: Callable[[Any, Any], Any]  # (x, dtype)
    log_softmax: Callable[[Any, int], Any]  # (x, axis)
    # (log_prob, int64 target, reduction): the framework's fused kernel for the loss without
    # weights or ignore_index, where it has one
    fused: Callable[[Any, Any, str], Any] | None = None


def nll(kit: Kit, node, log_prob, target, weight):
    """The loss of `log_prob` at `target` by the node's ignore_index, weights and reduction."""
    reduction = node.attr("reduction", "mean")
    ignore = node.attr("ignore_index")
    target = kit.int64(target)
    if kit.fused is not None and weight is None and ignore is None:
        return kit.fused(log_prob, target, reduction)
    valid = target != ignore if ignore is not None else kit.true_like(target)
    safe = kit.where(valid, target, 0)
    loss = -kit.pick(log_prob, safe)
    if weight is not None:
        w = weight[safe] * kit.cast(valid, log_prob.dtype)
    elif ignore is not None and ignore != -1:  # (ONNX's reference: -1 is never masked here)
        w = kit.cast(valid, log_prob.dtype)
    else:
        w = None
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum() if w is not None else loss.mean()


def NegativeLogLikelihoodLoss(kit: Kit, node, x, target, weight=None):
    return nll(kit, node, x, target, weight)


def SoftmaxCrossEntropyLoss(kit: Kit, node, x, target, weight=None):
    log_prob = kit.log_softmax(x, 1)
    loss = nll(kit, node, log_prob, target, weight)
    return (loss, log_prob) if len(node.outputs) > 1 else loss


def table(kit: Kit) -> dict[str, Any]:
    """The two losses bound to a framework's `kit`, keyed as an op table keys them."""
    return {fn.__name__: functools.partial(fn, kit)
            for fn in (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)}
