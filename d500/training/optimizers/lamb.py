"""LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes", Algorithm 2 with bias correction, phi = identity), per parameter tensor w:

    m <- beta1 m + (1 - beta1) g           v <- beta2 v + (1 - beta2) g^2
    r <- (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
    u <- r + weight_decay * w
    w <- w - lr * ||w|| / ||u|| * u         (ratio 1 if ||w|| = 0 or ||u|| = 0)

With `exclude_1d` 1-D and 0-d tensors (biases, normalization scales) get neither weight decay
nor the trust ratio (then it is Adam). Keras's Lamb is this with weight_decay 0, exclude_1d off.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from d500.training.optimizers.adam import moments
from d500.training.optimizers.base import Hyper, Optimizer
from d500.training.optimizers.lars import adapted


class LAMB(Optimizer):
    """Adam moments with a per-layer trust ratio."""

    name = "lamb"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **Optimizer.hyperparameters,
        "beta1": Hyper(0.9, "fraction", "decay of the first moment"),
        "beta2": Hyper(0.999, "fraction", "decay of the second moment"),
        "eps": Hyper(1e-6, "positive", "added to the denominator"),
        "weight_decay": Hyper(0.0, "nonnegative", "decoupled decay inside the update (You: 0.01)"),
        "exclude_1d": Hyper(True, "bool", "no decay and no trust ratio for 1-D/0-d tensors"),
    }

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        mask = adapted(params, self.exclude_1d)
        return {"m": ops.zeros_like(params), "v": ops.zeros_like(params),
                "decay": [self.weight_decay * a for a in mask],  # Python floats
                "adapt": ops.vector(mask, params[0])}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        denom, bc1 = moments(ops, state, grads, self.beta1, self.beta2, self.eps, t)
        u = ops.div(state["m"], denom)
        ops.mul_(u, 1.0 / bc1)
        if self.weight_decay:
            ops.add_(u, ops.mul(params, state["decay"]))
        w = ops.stack(ops.norm(params))
        n = ops.stack(ops.norm(u))
        ok = (w * state["adapt"] > 0) & (n > 0)  # else (excluded, or a zero norm) ratio 1
        ratio = ops.where(ok, w / ops.where(ok, n, 1.0), 1.0)
        ops.mul_(u, ops.unstack(ratio * -lr))
        ops.add_(params, u)
