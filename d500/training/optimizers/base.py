"""The framework-neutral Optimizer base class (subclass it to write a new optimizer), its
validated hyperparameters, and the State it keeps in framework tensors.

    class SignSGD(Optimizer):
        '''Sign descent: p -= lr * sign(g).'''
        name = "signsgd"
        hyperparameters = {**Optimizer.hyperparameters, "momentum": Hyper(0.0, "fraction")}

        def init_state(self, ops, params, names):
            return {"m": ops.zeros_like(params)}

        def update(self, ops, params, grads, state, lr, t):
            ops.lerp_(state["m"], grads, 1 - self.momentum)
            ops.add_(params, ops.sign(state["m"]), -lr)

`params`, `grads` and every state entry are lists with one tensor per parameter (in the order of
`names`); `ops` is the framework's ops namespace (see ops/__init__.py); `lr` a scalar (a Python
float, or a tf tensor inside a tf.function); `t` the step count starting at 1. Hyperparameters
are attributes (`self.momentum`). Write every update with `ops` and Python operators only, and
it runs on NumPy, torch and TensorFlow (inside tf.function) unchanged. Branch in Python only on
hyperparameters, never on `lr`, `t` or tensor values (inside a tf.function they are symbolic):
use `ops.where` for those.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from d500.errors import ConfigError, UsageError, listed
from d500.training.optimizers import ops as ops_registry

# kind -> (test, what it means); values from YAML arrive as int/float/bool
KINDS = {
    "positive": (lambda v: v > 0, "a finite number > 0"),
    "nonnegative": (lambda v: v >= 0, "a finite number >= 0"),
    "fraction": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "bool": (None, "true or false"),
}


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter: its default and its kind ('positive', 'nonnegative', 'fraction' =
    [0, 1), 'bool'); cross-parameter rules go in Optimizer.check()."""

    default: Any
    kind: str = "positive"
    help: str = ""


def check_value(owner: str, name: str, hyper: Hyper, value: Any) -> Any:
    """`value` as the hyperparameter's type, or a ConfigError naming the hyperparameter."""
    if hyper.kind not in KINDS:
        raise ConfigError(f"{owner}: hyperparameter '{name}' has unknown kind '{hyper.kind}' "
                          f"(known: {', '.join(KINDS)})")
    test, meaning = KINDS[hyper.kind]
    if hyper.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{owner}: hyperparameter '{name}' must be {meaning}, "
                              f"got {value!r}")
        return value
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and test(value))
    if not ok:
        raise ConfigError(f"{owner}: hyperparameter '{name}' must be {meaning}, got {value!r}")
    return float(value)


class State:
    """What `init` made: the ops namespace, the parameter names (their order), the state tensors
    (lists or vectors by slot name) and the step counter; all of it in framework objects."""

    __slots__ = ("count", "names", "ops", "slots")

    def __init__(self, ops: ModuleType, names: Sequence[str], slots: dict[str, Any],
                 count: Any):
        self.ops, self.names, self.slots, self.count = ops, tuple(names), slots, count

    def __repr__(self) -> str:
        return (f"State({self.ops.name}, {len(self.names)} parameters, "
                f"slots={sorted(self.slots)})")


class Optimizer:
    """A framework-neutral optimizer: validated hyperparameters, `init` and `step`.

    Subclasses set `name`, `hyperparameters` (extend `Optimizer.hyperparameters`, which holds
    the base learning rate `lr`), and implement `update` (and `init_state` if they keep state,
    `check` for rules across hyperparameters). See the module docstring for an example.
    """

    name: ClassVar[str] = "?"
    hyperparameters: ClassVar[dict[str, Hyper]] = {
        "lr": Hyper(1e-3, "positive", "base learning rate; a schedule scales it per step")}

    def __init__(self, **hp: Any):
        owner = f"optimizer '{self.name}'"
        unknown = sorted(set(hp) - set(self.hyperparameters))
        if unknown:
            raise ConfigError(f"{owner}: unknown hyperparameter '{unknown[0]}' "
                              f"(known: {listed(unknown[0], self.hyperparameters)})")
        self.hp: dict[str, Any] = {
            k: check_value(owner, k, h, hp.get(k, h.default))
            for k, h in self.hyperparameters.items()}
        for k, v in self.hp.items():
            setattr(self, k, v)
        self.check()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.hp.items())})"

    # -- what a subclass writes -----------------------------------------------------------------
    def check(self) -> None:
        """Rules across hyperparameters; raise ConfigError naming the hyperparameter."""

    def init_state(self, ops: ModuleType, params: list[Any], names: list[str]) -> dict[str, Any]:
        """The state slots by name: lists of tensors from `ops.zeros_like`/`full_like`, or
        vectors from `ops.vector`. Default: no state."""
        return {}

    def update(self, ops: ModuleType, params: list[Any], grads: list[Any],
               state: dict[str, Any], lr: Any, t: Any) -> None:
        """Update `params` (and the state) in place with ops' in-place functions."""
        raise NotImplementedError

    # -- what the trainer calls -----------------------------------------------------------------
    def init(self, params: Mapping[str, Any], ns: str | ModuleType) -> State:
        """The state for `params` (name -> framework tensor/variable) on framework `ns`
        ('numpy', 'reference', 'torch', 'tensorflow', or an ops module). Call it once, outside
        any tf.function: TensorFlow state is tf.Variables made here."""
        ops = ops_registry.get(ns)
        names = list(params)
        if not names:
            raise UsageError(f"optimizer '{self.name}': no parameters to optimize")
        values = [params[n] for n in names]
        return State(ops, names, self.init_state(ops, values, names), ops.counter())

    def step(self, params: Mapping[str, Any], grads: Mapping[str, Any], state: State,
             lr: Any) -> None:
        """One update of `params` in place from `grads` (same names, no None) at learning rate
        `lr` (a Python float, or a 0-d tensor of the framework; inside a tf.function, a float32
        tf tensor, so that one trace serves every step). On JAX, whose arrays are immutable,
        `params` must be a dict: its entries are replaced by the updated arrays."""
        ops = state.ops
        try:
            ps = [params[n] for n in state.names]
            gs = [grads[n] for n in state.names]
        except KeyError as err:
            raise UsageError(f"optimizer '{self.name}': no parameter or gradient named "
                             f"{err.args[0]!r}; init() saw {list(state.names)}") from None
        with ops.no_grad():
            self.update(ops, ps, gs, state.slots, lr, ops.increment(state.count))
        if getattr(ops, "immutable", False):  # JAX: the updated arrays replaced the list entries
            for name, value in zip(state.names, ps):
                params[name] = value
