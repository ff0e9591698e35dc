"""Adaptive batch size: a recipe's batch grown by whole epochs in place of a decaying learning
rate (Smith, Kindermans, Ying and Le, "Don't decay the learning rate, increase the batch size",
ICLR 2018), within the workload's batch limits.

    batch_schedule: {growth: 2, every_epochs: 2, max: 256}   # 32, 32, 64, 64, 128, 128, 256, ...
    batch_schedule: {growth: 2, milestones: [3, 6]}          # x2 after epoch 3, x2 after epoch 6

The batch of epoch e (0-based) is batch_size x growth ** k, k the number of growths due by then
(e // every_epochs, or the milestones <= e), capped at `max`. The supervisor decides it and sends
it with every chunk (d500.training.trainer); the worker, which runs the entry's code, trains at
the batch it is sent. Growth replaces the decay: a recipe that grows its batch keeps a constant
learning rate (a warm-up allowed; Recipe.check), so no run both decays and grows.

A run's samples are counted at the batch of each epoch: `Plan.samples(step)` is MLPerf's
samples_count, `Plan.epoch(step)` the epoch an evaluation stands at.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any

from d500.errors import ConfigError, listed

KEYS = ("growth", "every_epochs", "milestones", "max")
FIELD = "batch_schedule"  # the recipe's field, and the prefix of its logged hyperparameters


def _int(key: str, value: Any, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ConfigError(f"field '{FIELD}.{key}' must be an integer >= {lowest}, got {value!r}")
    return value


@dataclass(frozen=True)
class BatchSchedule:
    """A validated batch schedule; `at(base, epoch)` is the batch of a 0-based epoch."""

    growth: int
    every_epochs: int | None = None
    milestones: tuple[int, ...] = ()
    max: int | None = None

    def at(self, base: int, epoch: int) -> int:
        k = (epoch // self.every_epochs if self.every_epochs
             else bisect.bisect_right(self.milestones, epoch))
        batch = base * self.growth ** k
        return batch if self.max is None else min(batch, self.max)


def parse(spec: Any) -> BatchSchedule | None:
    """The schedule a recipe's `batch_schedule` field declares (None: none); a ConfigError
    names the key that is wrong."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"field '{FIELD}' must be a mapping: {{growth, every_epochs, max}} or "
                          f"{{growth, milestones, max}}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ConfigError(f"field '{FIELD}': unknown key '{unknown[0]}' (known: "
                          f"{listed(unknown[0], KEYS)})")
    if ("every_epochs" in spec) == ("milestones" in spec):
        raise ConfigError(f"field '{FIELD}' needs exactly one of 'every_epochs' (grow every N "
                          f"epochs) and 'milestones' (grow after these epochs)")
    growth = _int("growth", spec.get("growth"), 2)
    cap = None if spec.get("max") is None else _int("max", spec["max"], 1)
    if "every_epochs" in spec:
        return BatchSchedule(growth, every_epochs=_int("every_epochs", spec["every_epochs"], 1),
                             max=cap)
    marks = spec["milestones"]
    if not isinstance(marks, list) or not marks:
        raise ConfigError(f"field '{FIELD}.milestones' must be a non-empty list of epochs")
    marks = tuple(_int("milestones", m, 1) for m in marks)
    if any(b <= a for a, b in itertools.pairwise(marks)):
        raise ConfigError(f"field '{FIELD}.milestones' must increase, got {list(marks)}")
    return BatchSchedule(growth, milestones=marks, max=cap)


def logged(spec: dict[str, Any] | None) -> dict[str, Any]:
    """The schedule as a run's hyperparameters record it (batch_schedule_<key>)."""
    return {f"{FIELD}_{k}": v for k, v in (spec or {}).items()}


def from_logged(hyperparameters: dict[str, Any]) -> dict[str, Any] | None:
    """The `batch_schedule` spec a run's recorded hyperparameters hold (None: a fixed batch)."""
    prefix = f"{FIELD}_"
    spec = {k[len(prefix):]: v for k, v in hyperparameters.items() if k.startswith(prefix)}
    return spec or None


def batches(schedule: BatchSchedule | None, base: int, epochs: int) -> list[int]:
    """The batch of each of `epochs` epochs."""
    return [base if schedule is None else schedule.at(base, e) for e in range(epochs)]


@dataclass(frozen=True)
class Plan:
    """A run's batch and step count per epoch; `samples` and `epoch` at a step count."""

    batches: tuple[int, ...]
    steps: tuple[int, ...]

    @classmethod
    def of(cls, batches_: list[int], size: int, drop_last: bool) -> Plan:
        """The plan over a training split of `size` samples (steps as EpochSampler cuts them)."""
        from d500.training.data.samplers import EpochSampler
        return cls(tuple(batches_), tuple(len(EpochSampler(size, b, 0, drop_last))
                                          for b in batches_))

    @property
    def total(self) -> int:
        return sum(self.steps)

    @property
    def fixed(self) -> bool:
        return len(set(self.batches)) <= 1

    def samples(self, step: int) -> int:
        """Samples trained after `step` steps (each step at its epoch's batch)."""
        out = 0
        for batch, count in zip(self.batches, self.steps, strict=True):
            take = min(step, count)
            out, step = out + take * batch, step - take
        return out + step * self.batches[-1]

    def step_of(self, samples: int) -> float:
        """The steps after which `samples` were trained (the inverse of `samples`)."""
        out = 0
        for batch, count in zip(self.batches, self.steps, strict=True):
            if samples <= count * batch:
                return out + samples / batch
            out, samples = out + count, samples - count * batch
        return out + samples / self.batches[-1]

    def epoch(self, step: int) -> float:
        """The epochs done after `step` steps (whole ones, plus the fraction of the next)."""
        if self.fixed:
            return step / self.steps[0]
        done = 0
        for count in self.steps:
            if step < count:
                return done + step / count
            done, step = done + 1, step - count
        return float(done)
