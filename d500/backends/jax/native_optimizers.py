"""JAX's native twins of d500's optimizers: optax transformations giving the direction of the
update (the JAX trainer applies p += -lr * direction), by d500's name: FRAMEWORK's
`native_optimizers` (d500.training.optimizers.native says how twins are judged)."""

from __future__ import annotations

from typing import Any

from d500.training.optimizers.native import refuse


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
        refuse(name, "optax's Adagrad has no lr_decay", "optax")
    parts = [optax.add_decayed_weights(hp["weight_decay"])] if hp["weight_decay"] else []
    parts.append(optax.scale_by_rss(initial_accumulator_value=hp["initial_accumulator_value"],
                                    eps=hp["eps"]))
    return optax.chain(*parts)


NATIVE = {"sgd": _optax_sgd, "momentum": _optax_sgd, "nesterov": _optax_sgd,
          "adam": _optax_adam, "adamw": _optax_adam, "adagrad": _optax_adagrad}
