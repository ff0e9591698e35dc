"""Learning-rate schedules: pure Python functions of (step, total_steps) -> a factor of the
optimizer's base lr, so they cost nothing per step; parameters validated when made.

    s = schedule("cosine", floor=0.01, warmup=0.05)
    lr = opt.lr * s(step, total_steps)          # step = 0, 1, ..., total_steps - 1

Base shapes, over the progress p in [0, 1] of the steps after the warm-up:
    constant    1
    step        gamma ** (number of milestones <= p); milestones are fractions in (0, 1)
    cosine      floor + (1 - floor) * (1 + cos(pi p)) / 2
    polynomial  floor + (1 - floor) * (1 - p) ** power
Linear warm-up (Goyal et al. 2017) composes with any of them: over the first `warmup_steps`
steps (or the fraction `warmup` of the total) the factor rises linearly from `warmup_start` to
1, reaching 1 at the warm-up's last step; the base shape then runs over the remaining steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from d500.errors import ConfigError, listed

SCHEDULES = ("constant", "step", "cosine", "polynomial")
WARMUP = ("warmup", "warmup_steps", "warmup_start")
PARAMETERS = {"constant": (), "step": ("milestones", "gamma"), "cosine": ("floor",),
              "polynomial": ("power", "floor")}


@dataclass(frozen=True)
class Schedule:
    """A validated schedule; call it as `s(step, total_steps)`."""

    name: str
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    floor: float = 0.0
    power: float = 1.0
    warmup: float = 0.0  # fraction of total_steps (used when warmup_steps is None)
    warmup_steps: int | None = None
    warmup_start: float = 0.0
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def __call__(self, step: int, total_steps: int) -> float:
        if total_steps < 1:
            raise ConfigError(f"schedule '{self.name}': total_steps must be >= 1, "
                              f"got {total_steps}")
        w = (self.warmup_steps if self.warmup_steps is not None
             else round(self.warmup * total_steps))
        if step < w:
            return self.warmup_start + (1.0 - self.warmup_start) * (step + 1) / w
        p = min(max((step - w) / max(total_steps - w, 1), 0.0), 1.0)
        return self.shape(p)

    def shape(self, p: float) -> float:
        """The base factor at progress p in [0, 1]."""
        if self.name == "step":
            return self.gamma ** sum(1 for m in self.milestones if p >= m)
        if self.name == "cosine":
            return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * p))
        if self.name == "polynomial":
            return self.floor + (1.0 - self.floor) * (1.0 - p) ** self.power
        return 1.0


def _number(name: str, key: str, value: Any, ok: Any, meaning: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not ok(value)):
        raise ConfigError(f"schedule '{name}': parameter '{key}' must be {meaning}, "
                          f"got {value!r}")
    return float(value)


def schedule(name: str = "constant", **params: Any) -> Schedule:
    """The schedule `name` (constant, step, cosine, polynomial) with its parameters and an
    optional linear warm-up (`warmup` fraction or `warmup_steps`, `warmup_start`)."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule '{name}' (known: {listed(name, SCHEDULES)})")
    allowed = PARAMETERS[name] + WARMUP
    for key in params:
        if key not in allowed:
            raise ConfigError(f"schedule '{name}': unknown parameter '{key}' "
                              f"(known: {listed(key, allowed)})")
    kw: dict[str, Any] = {}
    if "gamma" in params:
        kw["gamma"] = _number(name, "gamma", params["gamma"], lambda v: 0 < v <= 1,
                              "a number in (0, 1]")
    if "floor" in params:
        kw["floor"] = _number(name, "floor", params["floor"], lambda v: 0 <= v <= 1,
                              "a number in [0, 1] (a fraction of the base lr)")
    if "power" in params:
        kw["power"] = _number(name, "power", params["power"], lambda v: v > 0, "a number > 0")
    if name == "step":
        kw["milestones"] = _milestones(params.get("milestones"))
    if "warmup" in params and "warmup_steps" in params:
        raise ConfigError(f"schedule '{name}': give 'warmup' (a fraction) or 'warmup_steps', "
                          "not both")
    if "warmup" in params:
        kw["warmup"] = _number(name, "warmup", params["warmup"], lambda v: 0 <= v < 1,
                               "a fraction of the total steps in [0, 1)")
    if "warmup_steps" in params:
        value = params["warmup_steps"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"schedule '{name}': parameter 'warmup_steps' must be an "
                              f"integer >= 0, got {value!r}")
        kw["warmup_steps"] = value
    if "warmup_start" in params:
        kw["warmup_start"] = _number(name, "warmup_start", params["warmup_start"],
                                     lambda v: 0 <= v <= 1, "a number in [0, 1]")
    return Schedule(name, params=dict(params), **kw)


def _milestones(value: Any) -> tuple[float, ...]:
    meaning = "a non-empty increasing list of fractions in (0, 1)"
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError(f"schedule 'step': parameter 'milestones' must be {meaning}, "
                          f"got {value!r}")
    out = tuple(_number("step", "milestones", v, lambda x: 0 < x < 1, meaning) for v in value)
    if any(b <= a for a, b in itertools.pairwise(out)):
        raise ConfigError(f"schedule 'step': parameter 'milestones' must be {meaning}, "
                          f"got {list(value)!r}")
    return out
