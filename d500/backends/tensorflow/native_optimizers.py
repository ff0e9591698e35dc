"""TensorFlow's native twins of d500's optimizers (Keras optimizers on tf.Variables), by d500's
name: FRAMEWORK's `native_optimizers` (d500.training.optimizers.native says how twins are
judged, and what Keras computes differently)."""

from __future__ import annotations

from typing import Any

from d500.errors import ConfigError
from d500.training.optimizers.native import refuse


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
        refuse(name, "Keras decays weights decoupled, not as an L2 term under momentum")
    return _built(_keras().SGD(learning_rate=hp["lr"], momentum=hp["momentum"],
                               nesterov=hp["nesterov"],
                               weight_decay=hp["weight_decay"] or None), values)


def _keras_adam(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"]:
        refuse(name, "Keras's weight decay is decoupled (that is adamw)")
    return _built(_keras().Adam(learning_rate=hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                                epsilon=hp["eps"]), values)


def _keras_adamw(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    return _built(_keras().AdamW(learning_rate=hp["lr"], weight_decay=hp["weight_decay"],
                                 beta_1=hp["beta1"], beta_2=hp["beta2"], epsilon=hp["eps"]),
                  values)


def _keras_adagrad(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"] or hp["lr_decay"]:
        refuse(name, "Keras has no L2 decay nor lr_decay in Adagrad")
    return _built(_keras().Adagrad(learning_rate=hp["lr"], epsilon=hp["eps"],
                                   initial_accumulator_value=hp["initial_accumulator_value"]),
                  values)


def _keras_lamb(values: list[Any], hp: dict[str, Any], name: str) -> Any:
    if hp["weight_decay"] or hp["exclude_1d"]:
        refuse(name, "Keras's Lamb decays outside the trust ratio and adapts every tensor "
                "(set weight_decay 0 and exclude_1d false)")
    return _built(_keras().Lamb(learning_rate=hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                                epsilon=hp["eps"]), values)


NATIVE = {"sgd": _keras_sgd, "momentum": _keras_sgd, "nesterov": _keras_sgd,
          "adam": _keras_adam, "adamw": _keras_adamw, "adagrad": _keras_adagrad,
          "lamb": _keras_lamb}
