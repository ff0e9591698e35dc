"""Adagrad (Duchi, Hazan & Singer 2011), in torch.optim.Adagrad's convention.

    g <- g + weight_decay * p          s <- s + g^2          (s starts at initial_accumulator_value)
    p <- p - lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from d500.training.optimizers.base import Hyper, Optimizer


class Adagrad(Optimizer):
    """Adagrad with learning-rate decay and L2 weight decay."""

    name = "adagrad"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **Optimizer.hyperparameters,
        "lr": Hyper(1e-2, "positive", "base learning rate"),
        "lr_decay": Hyper(0.0, "nonnegative", "lr / (1 + (t - 1) * lr_decay)"),
        "weight_decay": Hyper(0.0, "nonnegative", "L2 penalty added to the gradient"),
        "initial_accumulator_value": Hyper(0.0, "nonnegative", "start of the sum of g^2"),
        "eps": Hyper(1e-10, "positive", "added to the denominator"),
    }

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        return {"sum": ops.full_like(params, self.initial_accumulator_value)}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        if self.weight_decay:
            grads = ops.add(grads, params, self.weight_decay)
        if self.lr_decay:
            lr = lr / (1.0 + (t - 1.0) * self.lr_decay)
        ops.addcmul_(state["sum"], grads, grads, 1.0)
        std = ops.sqrt(state["sum"])
        ops.add_(std, self.eps)
        ops.addcdiv_(params, grads, std, -lr)
