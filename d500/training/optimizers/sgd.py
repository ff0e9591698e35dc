"""SGD, heavy-ball momentum and Nesterov momentum, with L2 weight decay (torch.optim.SGD's
convention, dampening 0).

    g <- g + weight_decay * p
    b <- momentum * b + g                  (b starts at 0, so b_1 = g_1 as in torch)
    d <- g + momentum * b if nesterov else b
    p <- p - lr * d
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from d500.errors import ConfigError
from d500.training.optimizers.base import Hyper, Optimizer


class SGD(Optimizer):
    """Stochastic gradient descent; momentum and Nesterov as options."""

    name = "sgd"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **Optimizer.hyperparameters,
        "momentum": Hyper(0.0, "fraction", "heavy-ball momentum (0: none)"),
        "nesterov": Hyper(False, "bool", "Nesterov's look-ahead form (needs momentum > 0)"),
        "weight_decay": Hyper(0.0, "nonnegative", "L2 penalty added to the gradient"),
    }

    def check(self) -> None:
        if self.nesterov and self.momentum == 0:
            raise ConfigError(f"optimizer '{self.name}': hyperparameter 'nesterov' needs "
                              "'momentum' > 0")

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        return {"momentum": ops.zeros_like(params)} if self.momentum else {}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        if self.weight_decay:
            grads = ops.add(grads, params, self.weight_decay)
        if self.momentum:
            buf = state["momentum"]
            ops.mul_(buf, self.momentum)
            ops.add_(buf, grads)
            grads = ops.add(grads, buf, self.momentum) if self.nesterov else buf
        ops.add_(params, grads, -lr)


class Momentum(SGD):
    """SGD with heavy-ball momentum (default 0.9)."""

    name = "momentum"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **SGD.hyperparameters, "momentum": Hyper(0.9, "fraction", "momentum")}


class Nesterov(SGD):
    """SGD with Nesterov momentum (default 0.9)."""

    name = "nesterov"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        **SGD.hyperparameters, "momentum": Hyper(0.9, "fraction", "momentum"),
        "nesterov": Hyper(True, "bool", "Nesterov's look-ahead form")}
