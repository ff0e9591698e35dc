"""The level-2/3 part of d500 check's consistency step (d500.competition.consistency): a training
run's evaluations, target figures and times against its MLLOG, and the value helpers both use.

Training runs (levels 2 and 3, but not a level-3 rank's own row) log the evaluations
(d500.training.trainer, d500.distributed.loop): per evaluation eval_start, eval_accuracy (the
validation accuracy, with epoch_num and samples_count = step x global batch) and eval_stop; the
test set is evaluated on a copy of the model after the run, or with the clock paused where that
cannot wait, and the evaluation row written with its eval_stop's time (d500.training.heldout).
Checked:
- the evaluation rows pair one to one, in order, with the eval_accuracy events (same epoch,
  val_accuracy equal to the logged value, step x global_batch_size = samples_count, or the
  samples at each epoch's batch where the recipe's batch_schedule grew it), and each epoch is
  the one its step reaches over the rules' training split (epochs inflated alike in the record
  and the log escaped MLPerf's RCP scaling: digits-mlp's x1.313 became x1); a run that
  failed or was interrupted may have logged one evaluation it did not live to record;
- micro_batch_size (level 2: batch_size; level 3: per_rank_batch_size), data_parallelism (the
  world size), d500_target and train_samples/eval_samples against the workload's rules;
- status, epochs, steps, time_to_accuracy: the first eval_accuracy at or beyond the workload's
  target decides them as the trainer does (succeeded when its wall time is within max_seconds,
  missed otherwise; epochs = its epoch_num, steps = its samples_count / global batch,
  time_to_accuracy = its evaluation's wall time; infinity when missed); val_accuracy the last
  logged eval_accuracy, final_test_accuracy the last evaluation's test accuracy, test_accuracy
  that of the evaluation meeting the target (a language model's: val_log_perplexity and
  test_log_perplexity, its target met at or below the value: Rules.quality, Rules.lower);
- time: the trainer's clock starts at run_start's timestamp and reads its time (`wall_time`,
  time_to_accuracy) at eval_stop's (both stamped with the wall time read together with the
  clock: Run.begin, the trainers' evaluate), less the test evaluations, which lie between an
  earlier eval_stop and the next line logged. So each evaluation's wall time must lie in
  [eval_stop - run_start - those gaps, eval_stop - run_start], widened by TOLERANCE_S +
  TOLERANCE_REL x (eval_stop - run_start) for log times rounded to milliseconds, logs written
  before the clocks were read together, and drift between the wall clock and the monotonic
  one. Its `recorded` time lies between its eval_stop and the next line logged;
- the time split and throughput: train_time + data_time + eval_time at most the last
  evaluation's wall time (the trainer's intervals are disjoint parts of it), samples_per_second
  = last evaluation's step x global batch / train_time; and the three at least PARTS_LEAST of
  that wall time (512 succeeded level-2/3 runs on this machine: 0.73 or more, median 0.97), so
  train_time cannot be shrunk alone to inflate samples_per_second. Moved into data_time it
  passes (the README's "what the checks cannot prove").
Test accuracies and the training loss are in no log line but the figures': a sender who forges
them must forge those lines and re-seal the log. That remains possible; only `d500 reproduce`
checks the figures themselves.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from d500 import mllog
from d500.ledger import finite
from d500.untrusted import json_value

TOLERANCE_S = 0.1  # seconds: ms rounding and scheduler pauses between a log line and the clock
TOLERANCE_REL = 0.02  # of the interval measured: clock drift, generously
PARTS_LEAST = 0.5  # of the last wall time the trainer's train, data and eval time together fill
TARGET_FIGURES = ("time_to_accuracy", "epochs", "steps")


@dataclass(frozen=True)
class Rules:
    """What a workload's rules say that its runs' logs must agree with (None: not given)."""

    target: float | None = None
    max_seconds: float | None = None
    train: int | None = None
    validation: int | None = None
    quality: str = "accuracy"  # figures val_<quality>, test_<quality>, final_test_<quality>
    lower: bool = False  # the target is met at or below it (log-perplexity)
    text: bool = False  # a language model on a text corpus: its log states attention's precision
    drop_last: bool = True  # with train and max_epochs: a growing batch's steps per epoch
    max_epochs: int | None = None
    every_epochs: int | None = None  # the evaluation cadence (exactly one is set)
    every_steps: int | None = None

    def met(self, value: float | None) -> bool:
        if value is None or self.target is None:
            return False
        return value <= self.target if self.lower else value >= self.target


class Training:
    """A level-2/3 run's evaluations, target figures and times against its log."""

    def __init__(self, run: Any, records: list[dict[str, Any]], workload: Rules):
        self.run, self.records, self.rules = run, records, workload
        self.first = {}
        for r in records:
            self.first.setdefault(r["key"], r)
        self.evals = [i for i, r in enumerate(records) if r["key"] == mllog.EVAL_ACCURACY]
        self.rows = [evaluation(e) for e in run.evaluations]
        self.batch = number((self.first.get(mllog.GLOBAL_BATCH_SIZE) or {}).get("value"))
        self.plan = self._plan()  # a batch_schedule's batches and steps per epoch, or None
        self.epochs = self.plan or self._fixed()  # what epoch(step) each evaluation is at
        # a resumed run's clock starts at what its earlier segments took (its log's does not)
        resumed = (getattr(run, "details", None) or {}).get("resumed") or {}
        self.before = number(resumed.get("before")) or 0.0
        self.out: list[str] = []

    def _plan(self) -> Any:
        """The run's batch per epoch where its recipe grew the batch (the record's
        batch_schedule_* hyperparameters, d500.training.batch_schedule), from the rules' split
        and budget; None for a fixed batch or where the rules do not say."""
        from d500.errors import ConfigError
        from d500.training import batch_schedule as grow
        spec, rules = grow.from_logged(self.run.hyperparameters), self.rules
        if spec is None or not self.batch or rules.train is None or rules.max_epochs is None:
            return None
        try:
            schedule = grow.parse(spec)
            return grow.Plan.of(grow.batches(schedule, int(self.batch), rules.max_epochs),
                                rules.train, rules.drop_last)
        except ConfigError as err:
            self.out.append(f"its recorded batch schedule is not one d500 can train ({err})")
            return None

    def _fixed(self) -> Any:
        """The fixed batch's plan over the rules' training split (None where the log or the
        rules do not say: a text corpus whose tokens no lm.TOKENS entry pins)."""
        from d500.training import batch_schedule as grow
        batch, rules = self.batch, self.rules
        from d500.errors import ConfigError
        if not finite(batch) or batch < 1 or batch != int(batch) or rules.train is None:
            return None
        try:  # (a batch beyond the split: keys() names the batch that is not the rules')
            plan = grow.Plan.of([int(batch)], rules.train, rules.drop_last)
        except ConfigError:
            return None
        return plan if plan.steps[0] > 0 else None

    def samples(self, step: float) -> float | None:
        """Samples trained after `step` steps: step x global batch, or at each epoch's batch."""
        if self.plan is not None:
            return float(self.plan.samples(int(step)))
        return None if not self.batch else step * self.batch

    def steps(self, samples: float) -> float | None:
        """The steps after which `samples` were trained (the inverse of `samples`)."""
        if self.plan is not None:
            return self.plan.step_of(int(samples))
        return None if not self.batch else samples / self.batch

    def problems(self) -> list[str]:
        """Every disagreement of the run's training record with its log, one line each."""
        self.keys()
        paired = self.pairs()
        if paired:
            self.cadence()
            self.times()
            self.target()
            self.split()
        return self.out

    def keys(self) -> None:
        """Batch, parallelism, target and split sizes the log states."""
        run, hyper, rules = self.run, self.run.hyperparameters, self.rules
        want = {mllog.MICRO_BATCH_SIZE: hyper.get("per_rank_batch_size",
                                                  hyper.get("batch_size")),
                "d500_target": rules.target, mllog.TRAIN_SAMPLES: rules.train,
                mllog.EVAL_SAMPLES: rules.validation}
        if run.level == 3:
            from d500.distributed.spec import data_ranks
            want["data_parallelism"] = data_ranks(run.world_size or 1, hyper)
        for key, value in want.items():
            line = self.first.get(key)
            if value is not None and line is not None and not same(number(line["value"]),
                                                                    number(value)):
                self.out.append(f"its MLLOG's '{key}' is {line['value']!r}, but "
                                f"{'its record' if key == mllog.MICRO_BATCH_SIZE else 'the rules'}"
                                f" say {value!r}")
        self.precision()

    def precision(self) -> None:
        """The precision the judge logged (what the worker's trainer computed in, checked
        against the recipe when the run started) against the one its record names."""
        from d500.training.precision import MLLOG, precision_of
        line, recorded = self.first.get(mllog.PRECISION_LINEAR), precision_of(self.run)
        if line is not None and line["value"] != MLLOG.get(recorded, recorded):
            self.out.append(f"its MLLOG's '{mllog.PRECISION_LINEAR}' is {line['value']!r}, but "
                            f"its record says precision {recorded}")

    def pairs(self) -> bool:
        """Evaluation rows against eval_accuracy lines, one to one; False when they cannot pair."""
        rows, evals = self.rows, self.evals
        extra = len(evals) - len(rows)
        if extra < 0 or (extra > 0 and not (extra == 1 and self.run.status in
                                             ("failed", "interrupted", "timeout"))):
            self.out.append(f"{len(rows)} evaluation(s) recorded, but {len(evals)} eval_accuracy "
                            "line(s) in its MLLOG")
            return False
        for n, (row, i) in enumerate(zip(rows, evals, strict=False), 1):
            line = self.records[i]
            epoch, count = (line["metadata"].get(k) for k in (mllog.EPOCH_NUM,
                                                              mllog.SAMPLES_COUNT))
            name = f"val_{self.rules.quality}"
            val = row["metrics"].get(name)
            where = f"evaluation {n} (epoch {row['epoch']})"
            if not same(number(epoch), row["epoch"]):
                self.out.append(f"{where}: its MLLOG's eval_accuracy {n} is at epoch {epoch}")
            whole = row["step"] if is_step(row["step"]) else None
            done = None if self.epochs is None or whole is None else self.epochs.epoch(whole)
            at = number(row["epoch"])
            if done is not None and at is not None \
                    and not math.isclose(at, done, rel_tol=1e-9, abs_tol=1e-9):
                self.out.append(f"{where}: step {row['step']} is epoch {done:.6g} of the rules' "
                                f"training split ({self.rules.train} samples), not "
                                f"{row['epoch']!r}")
            if not same(val, number(line["value"])):
                self.out.append(f"{where}: {name} {val!r}, but its MLLOG's eval_accuracy "
                                f"says {line['value']!r}")
            step = number(row["step"])
            if (self.batch is not None and row["step"] is not None
                    and not same(number(count), None if step is None else self.samples(step))):
                at = ("at each epoch's batch of its batch_schedule" if self.plan is not None
                      else f"x global_batch_size {self.batch:g}")
                self.out.append(f"{where}: step {row['step']} {at}, but its MLLOG's "
                                f"samples_count is {count}")
        return True

    def cadence(self) -> None:
        """Each evaluation at the next step the rules' cadence evaluates at (every K steps, or
        the end of every K epochs, counted from the step a resumed run started at); the last
        may come earlier, where the run stopped (its budget spent)."""
        steps = [row["step"] for row in self.rows]
        if self.epochs is None or not all(is_step(s) for s in steps):
            return
        resumed = (getattr(self.run, "details", None) or {}).get("resumed") or {}
        at = resumed.get("step") if is_step(resumed.get("step")) else 0
        for n, step in enumerate(steps):
            due = self._due(at)
            if due is None:
                return
            if step != due and not (n == len(steps) - 1 and at < step < due):
                every = (f"every {self.rules.every_steps} steps" if self.rules.every_steps
                         else f"at the end of every {self.rules.every_epochs} epoch(s)")
                self.out.append(f"evaluation {n + 1} (epoch {self.rows[n]['epoch']}): at step "
                                f"{step}, but the rules evaluate {every}, next at step {due}")
                return
            at = step

    def _due(self, after: int) -> int | None:
        """The first step past `after` the rules evaluate at (None: no cadence read)."""
        if self.rules.every_steps:
            return (after // self.rules.every_steps + 1) * self.rules.every_steps
        every, steps = self.rules.every_epochs, self.epochs.steps
        if not every or min(steps) < 1:
            return None
        ends = list(itertools.accumulate(steps))  # each epoch's last step; then the last batch's
        epoch = next((e for e, end in enumerate(ends, 1) if end > after), None)
        if epoch is None:
            epoch = len(ends) + (after - ends[-1]) // steps[-1] + 1
        epoch = -(-epoch // every) * every  # the first due at or past it
        return ends[epoch - 1] if epoch <= len(ends) else ends[-1] + (epoch - len(ends)) * steps[-1]

    def bounds(self, n: int) -> tuple[float, float] | None:
        """Seconds from run_start to evaluation n's eval_stop, less the longest the test
        evaluations before it can have taken (low) and as logged (high); None: no such lines.
        The clock pauses for them only before a checkpoint and where the kept models outgrew
        d500.training.heldout.LIMIT: after an evaluation at a step the run sealed no checkpoint
        at and recorded no such hold at, the next line's delay is no pause (re-stamping each
        epoch's first line later took digits-mlp's 0.278 s to 0.088 s)."""
        start = self.first.get(mllog.RUN_START)
        stop = self._after(self.evals[n], mllog.EVAL_STOP)
        if start is None or stop is None:
            return None
        paused = 0.0
        held = self._checkpointed() | self._held()
        for k, i in enumerate(self.evals[:n]):
            j = self._after(i, mllog.EVAL_STOP)
            if j is not None and j + 1 < len(self.records) and k < len(self.rows) \
                    and is_step(self.rows[k]["step"]) and self.rows[k]["step"] in held:
                paused += self.records[j + 1]["time_ms"] - self.records[j]["time_ms"]
        span = (self.records[stop]["time_ms"] - start["time_ms"]) / 1e3
        return span - paused / 1e3, span

    def _checkpointed(self) -> set[Any]:
        """The steps at which the run sealed a checkpoint (details.checkpoints)."""
        found = (getattr(self.run, "details", None) or {}).get("checkpoints")
        return {c.get("step") for c in found if isinstance(c, dict) and is_step(c.get("step"))} \
            if isinstance(found, list) else set()

    def _held(self) -> set[Any]:
        """The steps after whose evaluation the judge measured the kept models' test accuracy,
        the clock paused, as they outgrew heldout.LIMIT (details.held_tests; its bytes past it)."""
        from d500.training.heldout import LIMIT
        found = (getattr(self.run, "details", None) or {}).get("held_tests")
        return {h.get("step") for h in found if isinstance(h, dict) and is_step(h.get("step"))
                and is_step(h.get("bytes")) and h["bytes"] > LIMIT} \
            if isinstance(found, list) else set()

    def _after(self, i: int, key: str) -> int | None:
        return next((j for j in range(i, len(self.records)) if self.records[j]["key"] == key),
                    None)

    def _outside(self, value: float, n: int) -> str | None:
        """Why `value` (seconds on the run clock at evaluation n) is not what the log allows."""
        found = self.bounds(n)
        if found is None or not finite(value):
            return None
        value -= self.before
        low, high = found
        slack = TOLERANCE_S + TOLERANCE_REL * high
        if low - slack <= value <= high + slack:
            return None
        return (f"its MLLOG puts evaluation {n + 1} {low:.3f}-{high:.3f} s after run_start "
                f"(eval_stop less the test evaluations before it; tolerance {slack:.3f} s)")

    def times(self) -> None:
        """Each evaluation's wall time and `recorded` time against the log's timestamps."""
        for n, row in enumerate(self.rows):
            why = self._outside(row["wall_time"], n)
            if why is not None:
                self.out.append(f"evaluation {n + 1} (epoch {row['epoch']}): wall_time "
                                f"{row['wall_time']:.3f} s, but {why}")
            stop = self._after(self.evals[n], mllog.EVAL_STOP)
            if stop is None or not finite(row["recorded"]):
                continue
            low = self.records[stop]["time_ms"] / 1e3 - TOLERANCE_S
            nxt = self.records[stop + 1]["time_ms"] if stop + 1 < len(self.records) else None
            high = math.inf if nxt is None else (nxt + 1) / 1e3 + TOLERANCE_S
            if not low <= row["recorded"] <= high:
                self.out.append(f"evaluation {n + 1} (epoch {row['epoch']}): recorded at "
                                f"{row['recorded']:.3f} (unix s), outside its MLLOG's "
                                f"eval_stop..next line {low + TOLERANCE_S:.3f}-"
                                f"{high - TOLERANCE_S:.3f}")

    def target(self) -> None:
        """Status and the target figures as the first evaluation meeting the target decides."""
        run, figures, target = self.run, self.run.figures, self.rules.target
        last = self.rows[-1] if self.rows else None
        if last is not None and run.status in ("succeeded", "missed"):
            q = self.rules.quality
            for name, want in ((f"val_{q}", self.records[self.evals[-1]]["value"]),
                               (f"final_test_{q}", last["metrics"].get(f"test_{q}"))):
                if name in figures and not same(figures[name], number(want)):
                    self.out.append(f"figure {name} is {figures[name]!r}, but its last "
                                    f"evaluation says {want!r}")
        if target is None or run.status not in ("succeeded", "missed"):
            return
        met = next((n for n, i in enumerate(self.evals)
                    if self.rules.met(number(self.records[i]["value"]))), None)
        if met is None:
            if run.status == "succeeded":
                logged = [v for i in self.evals
                          if (v := number(self.records[i]["value"])) is not None]
                best = (min if self.rules.lower else max)(logged, default=None)
                self.out.append(f"status 'succeeded', but no eval_accuracy in its MLLOG reaches "
                                f"the target {target:g} (best {best!r})")
            self._missed(figures)
            return
        row, line = self.rows[met], self.records[self.evals[met]]
        at = f"the first evaluation meeting the target {target:g} in its MLLOG"
        at += f" (eval_accuracy {line['value']!r}) is evaluation {met + 1}, at epoch "
        at += f"{line['metadata'].get(mllog.EPOCH_NUM)}"
        found = self.bounds(met)
        budget = self.rules.max_seconds
        if run.status == "missed" and budget is not None and found is not None \
                and found[1] + TOLERANCE_S + TOLERANCE_REL * found[1] < budget:
            self.out.append(f"status 'missed', but {at}, at most {found[1]:.3f} s into the run "
                            f"by its MLLOG (budget {budget:g} s)")
        if run.status == "missed":
            self._missed(figures)
            return
        count = number(line["metadata"].get(mllog.SAMPLES_COUNT))
        want = {"epochs": number(line["metadata"].get(mllog.EPOCH_NUM)),
                "steps": None if count is None else self.steps(count),
                "time_to_accuracy": row["wall_time"],
                f"test_{self.rules.quality}": row["metrics"].get(f"test_{self.rules.quality}")}
        for name, value in want.items():
            if name in figures and value is not None and not same(figures[name], value):
                self.out.append(f"figure {name} is {figures[name]!r}, but {at} (its {name}: "
                                f"{value!r})")
        tta = figures.get("time_to_accuracy")
        why = None if tta is None else self._outside(tta, met)
        if why is not None:
            self.out.append(f"figure time_to_accuracy is {tta!r} s (evaluation {met + 1} met "
                            f"the target), but {why}")
        if budget is not None and finite(tta) and tta > budget:
            self.out.append(f"status 'succeeded', but time_to_accuracy {tta!r} s exceeds the "
                            f"budget {budget:g} s")

    def _missed(self, figures: dict[str, Any]) -> None:
        for name in TARGET_FIGURES:
            if name in figures and figures[name] != math.inf:
                self.out.append(f"figure {name} is {figures[name]!r}, but a run that missed its "
                                "target records infinity")

    def split(self) -> None:
        """Time split and throughput against the last evaluation (succeeded and missed runs)."""
        figures, last = self.run.figures, self.rows[-1] if self.rows else None
        if last is None or self.run.status not in ("succeeded", "missed"):
            return
        parts = [figures.get(k) for k in ("train_time", "data_time", "eval_time")]
        if all(finite(p) for p in parts) and finite(last["wall_time"]) \
                and sum(parts) > last["wall_time"] * (1 + 1e-9) + 1e-9:
            self.out.append(f"figures train_time + data_time + eval_time = {sum(parts):.6f} s, "
                            f"more than the last evaluation's wall time {last['wall_time']:.6f} s "
                            "(they are parts of it)")
        elif all(finite(p) for p in parts) and finite(last["wall_time"]) \
                and sum(parts) < last["wall_time"] * PARTS_LEAST:
            self.out.append(f"figures train_time + data_time + eval_time = {sum(parts):.6f} s, "
                            f"under {PARTS_LEAST:g} of the last evaluation's wall time "
                            f"{last['wall_time']:.6f} s (honest runs: 0.73 or more; a train_time "
                            f"shrunk inflates samples_per_second)")
        rate, train = figures.get("samples_per_second"), figures.get("train_time")
        step = number(last["step"])
        if finite(rate) and finite(train) and train > 0 and self.batch and step is not None:
            want = self.samples(step) / train
            at = (f"{self.samples(step):g} samples at each epoch's batch"
                  if self.plan is not None else f"x global batch {self.batch:g}")
            if not math.isclose(rate, want, rel_tol=1e-9):
                self.out.append(f"figure samples_per_second is {rate!r}, but its last "
                                f"evaluation's step {last['step']} {at} / train_time "
                                f"{train!r} = {want!r}")


# -- values -----------------------------------------------------------------------------------

def evaluation(row: list[Any]) -> dict[str, Any]:
    """An exported evaluation row [step, epoch, wall_time, metrics text, recorded] as a dict."""
    try:
        metrics = json_value(row[3])
    except (TypeError, ValueError):
        metrics = {}
    return {"step": row[0], "epoch": row[1], "wall_time": row[2],
            "metrics": metrics if isinstance(metrics, dict) else {}, "recorded": row[4]}


def is_step(value: Any) -> bool:
    """A recorded step count: a whole number a float holds exactly."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 53


def canon(value: Any) -> str:
    """A value as JSON text, encoded as the log encodes it (d500.mllog.jsonable), keys sorted."""
    return json.dumps(mllog.jsonable(value), sort_keys=True)


def as_float(value: Any) -> Any:
    """A logged number: the strings "inf", "-inf" and "nan" (how the log writes them) as floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def number(value: Any) -> float | None:
    """A logged or recorded number as a float (infinities and NaN too); None for anything else."""
    value = as_float(value)
    return float(value) if finite(value) or isinstance(value, float) else None


def same(a: Any, b: Any) -> bool:
    """Two recorded numbers equal (both NaN counts as equal; ints and floats compare by value)."""
    a, b = as_float(a), as_float(b)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return False
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))
