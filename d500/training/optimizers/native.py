"""The framework-native twins: the same optimizer name and hyperparameters as a torch.optim
optimizer, a Keras (tf.keras) optimizer or an optax transformation (JAX), for the second training
path and for the checks.

Where a framework computes the update differently from d500's optimizer of that name, the
mapping refuses with a ConfigError rather than give a differently-behaving twin: Keras applies
weight decay decoupled (p -= lr * wd * p) in every optimizer, so L2 decay with momentum, Adam or
Adagrad has no Keras twin; Keras's Lamb adapts every tensor (set exclude_1d false); LARS has no
twin anywhere, LAMB none in torch. Differences that remain, all small: Keras puts eps inside
sqrt() in Adagrad and scales Adam's eps by sqrt(1 - beta2^t); Keras's momentum buffer holds
lr * g (the same as torch's while lr is constant); optax's Adagrad (scale_by_rss) puts eps
inside sqrt() and has no lr_decay (refused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from d500.errors import ConfigError
from d500.training.optimizers.registry import make

FRAMEWORKS = {"torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow", "jax": "jax",
              "optax": "jax"}


def native(framework: str, name: str, params: Mapping[str, Any] | Iterable[Any],
           **hp: Any) -> Any:
    """A torch.optim optimizer over `params` (torch tensors), a Keras optimizer built on them
    (tf.Variables), or (jax) an optax transformation giving the update's direction, which the
    JAX trainer scales by -lr each step, for optimizer `name` with d500's hyperparameter names
    and defaults."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"no framework-native optimizers for '{framework}' "
                          f"(known: {', '.join(FRAMEWORKS)})")
    hp = make(name, **hp).hp  # validated, defaults filled in
    values = list(params.values()) if isinstance(params, Mapping) else list(params)
    table = {"torch": _TORCH, "tensorflow": _KERAS, "jax": _OPTAX}[FRAMEWORKS[framework]]
    if name not in table:
        raise ConfigError(f"optimizer '{name}' has no {FRAMEWORKS[framework]}-native twin; "
                          "use the framework-neutral one")
    return table[name](values, hp, name)


def set_lr(optimizer: Any, lr: float) -> None:
    """Set a native optimizer's learning rate (each step, from the schedule)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is not None:
        for group in groups:
            group["lr"] = lr
    else:
        optimizer.learning_rate.assign(lr)


def _refuse(name: str, why: str, framework: str = "Keras") -> None:
    raise ConfigError(f"optimizer '{name}' has no {framework} twin with these hyperparameters: "
                      f"{why}")


# -- torch ------------------------------------------------------------------------------------
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


_TORCH = {"sgd": _torch_sgd, "momentum": _torch_sgd, "nesterov": _torch_sgd,
          "adam": _torch_adam("Adam"), "adamw": _torch_adam("AdamW"),
          "adagrad": _torch_adagrad}


# -- Keras ------------------------------------------------------------------------------------
def _keras() -> Any:
    import keras
    if keras.config.backend() != "tensorflow":
        raise ConfigError(f"Keras runs on '{keras.config.backend()}' here (KERAS_BACKEND); "
                          "the TensorFlow-native optimizers need KERAS_BACKEND=tensorflow")
    return keras.optimizers


def _built(optimizer: Any, values: list[Any]) -> Any:
    optimizer.build(values)
    return optimizer


def _keras_sgd(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["momentum"] and hp["weight_decay"]:
        _refuse(name, "Keras decays weights decoupled, not as an L2 term under momentum")
    return _built(_keras().SGD(learning_rate=hp["lr"], momentum=hp["momentum"],
                               nesterov=hp["nesterov"],
                               weight_decay=hp["weight_decay"] or None), values)


def _keras_adam(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"]:
        _refuse(name, "Keras's weight decay is decoupled (that is adamw)")
    return _built(_keras().Adam(learning_rate=hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                                epsilon=hp["eps"]), values)


def _keras_adamw(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    return _built(_keras().AdamW(learning_rate=hp["lr"], weight_decay=hp["weight_decay"],
                                 beta_1=hp["beta1"], beta_2=hp["beta2"], epsilon=hp["eps"]),
                  values)


def _keras_adagrad(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"] or hp["lr_decay"]:
        _refuse(name, "Keras has no L2 decay nor lr_decay in Adagrad")
    return _built(_keras().Adagrad(learning_rate=hp["lr"], epsilon=hp["eps"],
                                   initial_accumulator_value=hp["initial_accumulator_value"]),
                  values)


def _keras_lamb(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"] or hp["exclude_1d"]:
        _refuse(name, "Keras's Lamb decays outside the trust ratio and adapts every tensor "
                "(set weight_decay 0 and exclude_1d false)")
    return _built(_keras().Lamb(learning_rate=hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                                epsilon=hp["eps"]), values)


_KERAS = {"sgd": _keras_sgd, "momentum": _keras_sgd, "nesterov": _keras_sgd,
          "adam": _keras_adam, "adamw": _keras_adamw, "adagrad": _keras_adagrad,
          "lamb": _keras_lamb}


# -- optax (JAX): the direction of the update; the trainer applies p += -lr * direction ---------
def _optax_sgd(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    import optax
    parts = [optax.add_decayed_weights(hp["weight_decay"])] if hp["weight_decay"] else []
    if hp["momentum"]:
        parts.append(optax.trace(decay=hp["momentum"], nesterov=hp["nesterov"]))
    return optax.chain(*parts) if parts else optax.identity()


def _optax_adam(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    import optax
    adam = optax.scale_by_adam(b1=hp["beta1"], b2=hp["beta2"], eps=hp["eps"])
    if not hp["weight_decay"]:
        return adam
    decay = optax.add_decayed_weights(hp["weight_decay"])
    # adam: L2 on the gradient (before the moments); adamw: decoupled (added to the direction)
    return optax.chain(decay, adam) if name == "adam" else optax.chain(adam, decay)


def _optax_adagrad(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    import optax
    if hp["lr_decay"]:
        _refuse(name, "optax's Adagrad has no lr_decay", "optax")
    parts = [optax.add_decayed_weights(hp["weight_decay"])] if hp["weight_decay"] else []
    parts.append(optax.scale_by_rss(initial_accumulator_value=hp["initial_accumulator_value"],
                                    eps=hp["eps"]))
    return optax.chain(*parts)


_OPTAX = {"sgd": _optax_sgd, "momentum": _optax_sgd, "nesterov": _optax_sgd,
          "adam": _optax_adam, "adamw": _optax_adam, "adagrad": _optax_adagrad}
