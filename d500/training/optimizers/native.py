"""The framework-native twins: the same optimizer name and hyperparameters as a torch.optim
optimizer, a Keras (tf.keras) optimizer or an optax transformation (JAX), for the second training
path and for the checks. Each framework's twins live in its folder (`native_optimizers.py`, the
table its FRAMEWORK names); this module finds them.

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

from collections.abc import Iterable, Mapping
from typing import Any

from d500.errors import ConfigError
from d500.training.optimizers.registry import make


def native(framework: str, name: str, params: Mapping[str, Any] | Iterable[Any],
           **hp: Any) -> Any:
    """A torch.optim optimizer over `params` (torch tensors), a Keras optimizer built on them
    (tf.Variables), or (jax) an optax transformation giving the update's direction, which the
    JAX trainer scales by -lr each step, for optimizer `name` with d500's hyperparameter names
    and defaults."""
    from d500.backends import by_module, frameworks
    fw = by_module(framework)
    if fw is None or fw.native_optimizers is None:
        known = [n for f in frameworks() if f.native_optimizers for n in (f.name, *f.aliases)]
        raise ConfigError(f"no framework-native optimizers for '{framework}' "
                          f"(known: {', '.join(known)})")
    hp = make(name, **hp).hp  # validated, defaults filled in
    values = list(params.values()) if isinstance(params, Mapping) else list(params)
    table = fw.hook(fw.native_optimizers)  # the twins in the framework's folder, by d500's name
    if name not in table:
        raise ConfigError(f"optimizer '{name}' has no {fw.name}-native twin; "
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


def refuse(name: str, why: str, framework: str = "Keras") -> None:
    """Refuse a twin that would compute differently: a ConfigError saying why."""
    raise ConfigError(f"optimizer '{name}' has no {framework} twin with these hyperparameters: "
                      f"{why}")
