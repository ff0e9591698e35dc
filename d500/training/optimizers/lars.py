"""LARS, layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, "Large Batch Training of
Convolutional Networks", Algorithm 1), per parameter tensor w with gradient g:

    trust <- eta * ||w|| / (||g|| + weight_decay * ||w|| + eps)     (1 if ||w|| = 0 or ||g|| = 0)
    v     <- momentum * v + lr * trust * (g + weight_decay * w)
    w     <- w - v

With `exclude_1d` (the common practice: biases and normalization scales) 1-D and 0-d tensors get
neither weight decay nor the trust ratio: plain momentum SGD with lr inside the buffer.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from d500.training.optimizers.base import Hyper, Optimizer


def adapted(params: list[Any], exclude_1d: bool) -> list[float]:
    """1.0 for each parameter that gets weight decay and the trust ratio, else 0.0."""
    return [0.0 if exclude_1d and len(p.shape) <= 1 else 1.0 for p in params]


class LARS(Optimizer):
    """SGD with momentum and a per-layer trust ratio."""

    name = "lars"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **Optimizer.hyperparameters,
        "lr": Hyper(0.1, "positive", "global learning rate"),
        "momentum": Hyper(0.9, "fraction", "momentum"),
        "weight_decay": Hyper(0.0, "nonnegative", "L2 penalty (You et al.: 5e-4)"),
        "eta": Hyper(0.001, "positive", "trust coefficient"),
        "eps": Hyper(0.0, "nonnegative", "added to the trust ratio's denominator"),
        "exclude_1d": Hyper(True, "bool", "no decay and no trust ratio for 1-D/0-d tensors"),
    }

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        mask = adapted(params, self.exclude_1d)
        return {"momentum": ops.zeros_like(params),
                "decay": [self.weight_decay * a for a in mask],  # Python floats
                "adapt": ops.vector(mask, params[0]),
                "decay_vec": ops.vector([self.weight_decay * a for a in mask], params[0])}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        w = ops.stack(ops.norm(params))
        g = ops.stack(ops.norm(grads))
        ok = (w * state["adapt"] > 0) & (g > 0)  # else (excluded, or a zero norm) trust 1
        denom = ops.where(ok, g + state["decay_vec"] * w + self.eps, 1.0)
        trust = ops.where(ok, self.eta * w / denom, 1.0)
        if self.weight_decay:
            grads = ops.add(grads, ops.mul(params, state["decay"]))
        buf = state["momentum"]
        ops.mul_(buf, self.momentum)
        ops.add_(buf, ops.mul(grads, ops.unstack(trust * lr)))
        ops.add_(params, buf, -1.0)
