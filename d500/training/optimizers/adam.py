"""Adam (Kingma & Ba 2015; L2 weight decay on the gradient, as torch.optim.Adam) and AdamW
(Loshchilov & Hutter 2019; decoupled weight decay, as torch.optim.AdamW).

    AdamW only: p <- p * (1 - lr * weight_decay)      Adam only: g <- g + weight_decay * p
    m <- beta1 m + (1 - beta1) g        v <- beta2 v + (1 - beta2) g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from d500.training.optimizers.base import Hyper, Optimizer


def moments(ops: ModuleType, state: dict[str, Any], grads: list[Any], beta1: float,
            beta2: float, eps: float, t: Any) -> tuple[list[Any], Any]:
    """Adam's moment step, shared with LAMB: m and v (state["m"], state["v"]) updated in place;
    returns (sqrt(v) / sqrt(1 - beta2^t) + eps, the bias correction 1 - beta1^t)."""
    m, v = state["m"], state["v"]
    ops.lerp_(m, grads, 1.0 - beta1)
    ops.mul_(v, beta2)
    ops.addcmul_(v, grads, grads, 1.0 - beta2)
    bc1 = ops.bias_correction(beta1, t)
    bc2 = ops.bias_correction(beta2, t)
    denom = ops.sqrt(v)
    ops.mul_(denom, 1.0 / bc2 ** 0.5)
    ops.add_(denom, eps)
    return denom, bc1


class Adam(Optimizer):
    """Adam with bias correction; weight decay as an L2 penalty on the gradient."""

    name = "adam"
    decoupled = False
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **Optimizer.hyperparameters,
        "beta1": Hyper(0.9, "fraction", "decay of the first moment"),
        "beta2": Hyper(0.999, "fraction", "decay of the second moment"),
        "eps": Hyper(1e-8, "positive", "added to the denominator"),
        "weight_decay": Hyper(0.0, "nonnegative", "L2 penalty added to the gradient"),
    }

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        return {"m": ops.zeros_like(params), "v": ops.zeros_like(params)}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        if self.weight_decay:
            if self.decoupled:
                ops.mul_(params, 1.0 - lr * self.weight_decay)
            else:
                grads = ops.add(grads, params, self.weight_decay)
        denom, bc1 = moments(ops, state, grads, self.beta1, self.beta2, self.eps, t)
        ops.addcdiv_(params, state["m"], denom, -lr / bc1)


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as torch)."""

    name = "adamw"
    decoupled = True
    hyperparameters: ClassVar[dict[str, Hyper]] = {**Adam.hyperparameters,
                       "weight_decay": Hyper(0.01, "nonnegative", "decoupled weight decay")}
