"""torch's native twins of d500's optimizers (torch.optim, foreach kernels), by d500's name:
FRAMEWORK's `native_optimizers` (d500.training.optimizers.native says how twins are judged)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _torch_sgd(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    import torch
    return torch.optim.SGD(values, lr=hp["lr"], momentum=hp["momentum"],
                           nesterov=hp["nesterov"], weight_decay=hp["weight_decay"],
                           foreach=True)


def _torch_adam(cls: str) -> Callable[[list[Any], dict[str, Any], str], Any]:
    def build(values: list[Any], hp: dict[str, Any], name: str) -> Any:
        import torch
        return getattr(torch.optim, cls)(values, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                         eps=hp["eps"], weight_decay=hp["weight_decay"],
                                         foreach=True)
    return build


def _torch_adagrad(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    import torch
    return torch.optim.Adagrad(values, lr=hp["lr"], lr_decay=hp["lr_decay"],
                               weight_decay=hp["weight_decay"],
                               initial_accumulator_value=hp["initial_accumulator_value"],
                               eps=hp["eps"], foreach=True)


NATIVE = {"sgd": _torch_sgd, "momentum": _torch_sgd, "nesterov": _torch_sgd,
          "adam": _torch_adam("Adam"), "adamw": _torch_adam("AdamW"),
          "adagrad": _torch_adagrad}
