"""A training recipe: what a level-2 submission chooses for one run (optimizer, hyperparameters,
learning-rate schedule, batch size and its growth), validated against the workload's rules
before any run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from d500.errors import ConfigError


@dataclass
class Recipe:
    """One run's choices. `optimizer_name` is a built-in's name or a submission's own optimizer's
    (`entry`, its file: validated in a child process, imported only where it trains);
    `schedule` holds `name` and the schedule's parameters."""

    optimizer_name: str
    hyperparameters: dict[str, Any]
    schedule_spec: dict[str, Any] = field(default_factory=lambda: {"name": "constant"})
    batch_size: int = 32
    native: bool = False
    entry: Any = None  # d500.training.entry.EntryOptimizer, for a submission's own file
    where: str = "submission"  # the file the recipe came from, for error messages
    precision: str = "fp32"  # what the linear layers compute in (d500.training.precision)
    batch_schedule: dict[str, Any] | None = None  # batch growth (d500.training.batch_schedule)

    def make_optimizer(self) -> Any:
        """A fresh optimizer with the recipe's hyperparameters (validated). For an entry's own
        file this imports it: call it only in the process that trains (the worker)."""
        from d500.training.optimizers import make
        try:
            if self.entry is not None:
                return self.entry.load()(**self.hyperparameters)
            return make(self.optimizer_name, **self.hyperparameters)
        except ConfigError as err:
            raise ConfigError(f"{self.where}: {err}") from None

    def hp(self) -> dict[str, Any]:
        """The optimizer's validated hyperparameters, defaults filled in, without importing an
        entry's file in this process (d500.training.entry probes it in a child process)."""
        if self.entry is None:
            return self.make_optimizer().hp
        try:
            return self.entry.hp(self.hyperparameters)
        except ConfigError as err:
            raise ConfigError(f"{self.where}: {err}") from None

    def make_schedule(self) -> Any:
        from d500.training.optimizers.schedules import schedule
        spec = dict(self.schedule_spec)
        name = spec.pop("name", "constant")
        try:
            return schedule(name, **spec)
        except ConfigError as err:
            raise ConfigError(f"{self.where}: field 'schedule': {err}") from None
        except TypeError as err:
            raise ConfigError(f"{self.where}: field 'schedule': {err}") from None

    def check(self, workload: Any) -> None:
        """The recipe fits the workload's rules: a batch size within its limits, an optimizer
        and a schedule whose parameters are valid. A ConfigError names what is wrong."""
        if not workload.batch_min <= self.batch_size <= workload.batch_max:
            raise ConfigError(f"{self.where}: batch_size {self.batch_size} is outside the "
                              f"limits of workload '{workload.name}' ({workload.batch_min} to "
                              f"{workload.batch_max})")
        self.batches(workload)
        from d500.training.precision import allowed
        allowed(self.precision, workload, self.where)
        if self.native and self.entry is not None:
            raise ConfigError(f"{self.where}: 'native: true' needs a built-in optimizer; a "
                              f"submission's own optimizer class has no framework-native twin")
        self.hp()
        self.make_schedule()

    def growth(self) -> Any:
        """The validated batch schedule (d500.training.batch_schedule.BatchSchedule), or None.
        It replaces the learning rate's decay: the lr schedule must then be constant."""
        from d500.training import batch_schedule
        try:
            grows = batch_schedule.parse(self.batch_schedule)
        except ConfigError as err:
            raise ConfigError(f"{self.where}: {err}") from None
        name = self.schedule_spec.get("name", "constant")
        if grows is not None and name != "constant":
            raise ConfigError(f"{self.where}: field 'batch_schedule' grows the batch in place of "
                              f"a decaying learning rate, so 'schedule' must be constant (a "
                              f"warm-up allowed), not '{name}'")
        if grows is not None and grows.max is not None and grows.max < self.batch_size:
            raise ConfigError(f"{self.where}: field 'batch_schedule.max' {grows.max} is below "
                              f"batch_size {self.batch_size}")
        return grows

    def batches(self, workload: Any) -> list[int]:
        """The batch of each epoch of `workload`'s budget, every one within its limits (a
        ConfigError names the first epoch beyond them)."""
        from d500.training.batch_schedule import batches
        grows = self.growth()
        out = batches(grows, self.batch_size, workload.max_epochs)
        if grows is not None and grows.max is not None and grows.max > workload.batch_max:
            raise ConfigError(f"{self.where}: field 'batch_schedule.max' {grows.max} exceeds "
                              f"workload '{workload.name}''s batch limit {workload.batch_max}")
        for epoch, batch in enumerate(out, 1):
            if batch > workload.batch_max:
                raise ConfigError(f"{self.where}: field 'batch_schedule' grows the batch to "
                                  f"{batch} at epoch {epoch}, beyond workload "
                                  f"'{workload.name}''s batch limit {workload.batch_max} (give "
                                  f"'max', or grow less)")
        return out

    def optimizer(self, backend: str) -> Any:
        """The optimizer a backend's trainer takes (the framework-native twin is chosen by the
        trainer when `native` is set)."""
        return self.make_optimizer()

    def schedule(self, total_steps: int) -> Callable[[int], float]:
        """The learning rate at each step: lr times the schedule's factor."""
        shape = self.make_schedule()
        lr = float(self.hyperparameters.get("lr", self.hp()["lr"]))
        return lambda step: lr * shape(step, total_steps)

    def hyperparameters_logged(self) -> dict[str, Any]:
        """Everything the run is recorded under (ledger hyperparameters, MLLOG opt_* keys)."""
        hp = {"optimizer": self.optimizer_name, **self.hp(),
              "batch_size": self.batch_size, "native": self.native}
        hp.update({f"schedule_{k}" if k != "name" else "schedule": v
                   for k, v in self.schedule_spec.items()})
        if self.precision != "fp32":  # absent: fp32, as every run before the field existed
            hp["precision"] = self.precision
        from d500.training.batch_schedule import logged
        hp.update(logged(self.batch_schedule))  # absent: a fixed batch
        return hp
