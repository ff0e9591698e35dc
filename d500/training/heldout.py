"""Test accuracy measured without pausing the clock: the judge keeps a copy of each model it
evaluated and measures the copies on the test split once the entry's code can no longer gain
from the time they take (the run's clock has stopped), and only where that cannot wait (before a
checkpoint, or once the copies outgrow LIMIT) with the clock paused and the entry's processes
held (d500.training.trainer._supervise).

Measured in the middle of the run, test accuracy paused the clock: the entry's processes had to
be stopped meanwhile (a thread of its own computed on uncounted time), and the stop and restart
cost each following chunk of training 0.2-0.4 ms on a 70 ms digits-mlp run (README). Each
evaluation's ledger row is written when its test accuracy is known, with the time the
evaluation was made (its MLLOG eval_stop) as its `recorded` time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LIMIT = 1 << 30  # bytes of kept models; past it they are measured at once, the clock paused


@dataclass
class Pending:
    """The evaluations whose test accuracy is still to measure, in order, each with the model the
    judge evaluated and its ledger row."""

    judge: Any  # d500.training.trainer.Judge: keep() and load()
    measure: Callable[..., float]  # (predict, x, y) -> the quality
    x: np.ndarray
    y: np.ndarray
    key: str  # the test figure's name in an evaluation's metrics (test_accuracy, ...)
    after: str  # the metric it follows in the row (the validation figure)
    items: list[tuple[dict[str, np.ndarray], dict[str, Any], bool]] = field(default_factory=list)
    size: int = 0

    def add(self, row: dict[str, Any], target: bool) -> None:
        """The model the judge holds now, with its evaluation's ledger row (run.evaluation's
        arguments); `target`: the evaluation that met the target."""
        kept = self.judge.keep()
        self.items.append((kept, row, target))
        self.size += sum(v.nbytes for v in kept.values())

    @property
    def full(self) -> bool:
        return self.size > LIMIT

    def measure_all(self, run: Any, state: dict[str, Any]) -> None:
        """Each kept model's test accuracy, written in its row, in order, into `state` ("test":
        the last; "test_at_target"); the judge holds the model it held before."""
        if not self.items:
            return
        now = self.judge.keep()
        try:
            while self.items:
                kept, row, target = self.items[0]
                self.judge.load(kept)
                test = self.measure(self.judge.predict, self.x, self.y)
                run.evaluation(**{**row, "metrics": self._with(row["metrics"], test)})
                del self.items[0]
                state["test"] = test
                if target:
                    state["test_at_target"] = test
        finally:
            self.judge.load(now)
            self.size = sum(sum(v.nbytes for v in k.values()) for k, _, _ in self.items)

    def write_untested(self, run: Any) -> None:
        """The rows left, without their test accuracy (a run interrupted: no time to take)."""
        for _, row, _ in self.items:
            run.evaluation(**row)
        self.items, self.size = [], 0

    @contextlib.contextmanager
    def written(self, run: Any, state: dict[str, Any]) -> Iterator[None]:
        """Around a run's loop: every row written when it ends, its test accuracy measured
        (`measure_all`) unless it was interrupted (^C: the rows without it)."""
        try:
            yield
        except Exception:
            with contextlib.suppress(Exception):  # the run failed: its rows as far as they go
                self.measure_all(run, state)
            self.write_untested(run)
            raise
        except BaseException:
            self.write_untested(run)
            raise
        try:
            self.measure_all(run, state)
        except BaseException:  # (^C while it measures: the rows left, as they are)
            self.write_untested(run)
            raise

    def _with(self, metrics: dict[str, float], test: float) -> dict[str, float]:
        out = {}
        for name, value in metrics.items():
            out[name] = value
            if name == self.after:
                out[self.key] = test
        return out
