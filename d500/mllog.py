"""MLPerf-style event log: one `:::MLLOG {json}` line per event, one file per run.

Lines carry namespace, time_ms, event_type (INTERVAL_START / INTERVAL_END / POINT_IN_TIME),
key, value and metadata (with the caller's file and lineno), as mlperf_logging writes them, so
MLPerf's parser and compliance checker read d500 logs unchanged. Key names are MLPerf's.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from d500.untrusted import json_value

TOKEN = ":::MLLOG "

# event types
INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
POINT_IN_TIME = "POINT_IN_TIME"

# submission description
SUBMISSION_BENCHMARK = "submission_benchmark"
SUBMISSION_ORG = "submission_org"
SUBMISSION_PLATFORM = "submission_platform"
SUBMISSION_DIVISION = "submission_division"
SUBMISSION_STATUS = "submission_status"
CLOSED = "closed"
OPEN = "open"

# intervals and points
INIT_START = "init_start"
INIT_STOP = "init_stop"
RUN_START = "run_start"
RUN_STOP = "run_stop"
EPOCH_START = "epoch_start"
EPOCH_STOP = "epoch_stop"
BLOCK_START = "block_start"
BLOCK_STOP = "block_stop"
EVAL_START = "eval_start"
EVAL_STOP = "eval_stop"
EVAL_ACCURACY = "eval_accuracy"

# run description
SEED = "seed"
GLOBAL_BATCH_SIZE = "global_batch_size"
TRAIN_SAMPLES = "train_samples"
EVAL_SAMPLES = "eval_samples"
TRAINED_SAMPLES = "trained_samples"
OPT_NAME = "opt_name"
OPT_BASE_LR = "opt_base_learning_rate"
OPT_WEIGHT_DECAY = "opt_weight_decay"
OPT_MOMENTUM = "opt_momentum"  # not an MLPerf constant; d500 follows the opt_* pattern
OPT_GRADIENT_CLIP_NORM = "opt_gradient_clip_norm"
OPT_LR_WARMUP_STEPS = "opt_learning_rate_warmup_steps"
OPT_ADAM_BETA_1 = "opt_adam_beta_1"
OPT_ADAM_BETA_2 = "opt_adam_beta_2"
OPT_ADAM_EPSILON = "opt_adam_epsilon"

# system, precision and parallelism description (MLPerf Training's keys)
CACHE_CLEAR = "cache_clear"
CONFIG_FILENAME = "config_filename"
MICRO_BATCH_SIZE = "micro_batch_size"
GRADIENT_ACCUMULATION_STEPS = "gradient_accumulation_steps"
PRECISION_LINEAR = "lowest_numerical_precision_in_linear"
PRECISION_ATTN = "lowest_numerical_precision_in_attn"
TENSOR_PARALLELISM = "tensor_parallelism"
PIPELINE_PARALLELISM = "pipeline_parallelism"
CONTEXT_PARALLELISM = "context_parallelism"
EXPERT_PARALLELISM = "expert_parallelism"

# metadata keys and values
EPOCH_NUM = "epoch_num"
EPOCH_COUNT = "epoch_count"
FIRST_EPOCH_NUM = "first_epoch_num"
SAMPLES_COUNT = "samples_count"
STATUS = "status"
SUCCESS = "success"
ABORTED = "aborted"

# hyperparameter names as submissions spell them -> MLPerf keys
HYPERPARAMETER_KEYS = {
    "batch_size": GLOBAL_BATCH_SIZE, "global_batch_size": GLOBAL_BATCH_SIZE,
    "lr": OPT_BASE_LR, "learning_rate": OPT_BASE_LR, "base_learning_rate": OPT_BASE_LR,
    "weight_decay": OPT_WEIGHT_DECAY, "momentum": OPT_MOMENTUM, "optimizer": OPT_NAME,
    "warmup_steps": OPT_LR_WARMUP_STEPS, "gradient_clip_norm": OPT_GRADIENT_CLIP_NORM,
    "beta1": OPT_ADAM_BETA_1, "beta2": OPT_ADAM_BETA_2, "eps": OPT_ADAM_EPSILON,
    "epsilon": OPT_ADAM_EPSILON, "train_samples": TRAIN_SAMPLES, "eval_samples": EVAL_SAMPLES,
}
# frames of these files are d500's own, not the caller's, in an event's file/lineno metadata
_OWN_FILE = __file__
_LEDGER_DIR = str(Path(__file__).with_name("ledger")) + os.sep


def hyperparameter_key(name: str) -> str:
    """The MLPerf key under which a hyperparameter is logged (`opt_<name>` when none exists)."""
    if name in HYPERPARAMETER_KEYS:
        return HYPERPARAMETER_KEYS[name]
    return name if name.startswith("opt_") else f"opt_{name}"


class MLLogger:
    """Appends `:::MLLOG` lines to one file; each line is flushed and fsync-free but complete.
    Lines of the keys `withhold` names wait in memory until `release` (or `close`), which puts
    them back where they were logged."""

    _held: list[tuple[int, str]] | None = None  # (the line's place in the file, the line)
    _keys: frozenset[str] = frozenset()
    _lines = 0  # lines in the file (counted from `withhold`)

    def __init__(self, path: str | Path, namespace: str = ""):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def withhold(self, *keys: str) -> None:
        """Keep the lines of `keys` out of the file until `release`: a run's evaluations are
        figures of its held-out data, and the entry's code, which may read any file its user
        can, read each one in the log the moment it was written
        (tests/distributed/test_val_leak_mpi.py)."""
        with self._lock:
            self._file.flush()
            with self.path.open(encoding="utf-8") as f:
                self._lines = sum(1 for _ in f)
            self._held, self._keys = [], frozenset(keys)

    def release(self) -> None:
        """Write the withheld lines where they were logged (the file rewritten in place)."""
        with self._lock:
            held, self._held, self._keys = self._held, None, frozenset()
            if not held or self._file.closed:
                return
            self._file.flush()
            with self.path.open("r+", encoding="utf-8") as f:
                lines = f.readlines()
                for i, (at, line) in enumerate(held):  # (in order: each after those before)
                    lines.insert(at + i, line + "\n")
                f.seek(0)
                f.writelines(lines)
                f.truncate()

    def start(self, key: str, value: Any = None, metadata: dict | None = None,
              time_ms: float | None = None) -> None:
        self._log(INTERVAL_START, key, value, metadata, time_ms)

    def end(self, key: str, value: Any = None, metadata: dict | None = None,
            time_ms: float | None = None) -> None:
        self._log(INTERVAL_END, key, value, metadata, time_ms)

    def event(self, key: str, value: Any = None, metadata: dict | None = None,
              time_ms: float | None = None) -> None:
        self._log(POINT_IN_TIME, key, value, metadata, time_ms)

    def close(self) -> None:
        self.release()
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def _line(self, event_type: str, key: str, value: Any, metadata: dict | None,
              time_ms: float | None) -> str:
        """The event's line, stamped now unless `time_ms` is given, with its caller's file and
        line under the metadata given."""
        meta = {**_caller(), **(metadata or {})}
        return encode(self.namespace, time.time() * 1e3 if time_ms is None else time_ms,
                      event_type, key, value, meta)

    def _log(self, event_type: str, key: str, value: Any, metadata: dict | None,
             time_ms: float | None) -> None:
        line = self._line(event_type, key, value, metadata, time_ms)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"MLLOG file {self.path} is closed")
            if self._held is not None and key in self._keys:
                self._held.append((self._lines, line))
                return
            self._file.write(line + "\n")
            self._file.flush()
            self._lines += 1


class MLBuffer(MLLogger):
    """An MLLogger that keeps its events in memory, as `parse` returns them, for a process that
    cannot write the run's file (an MPI rank whose ledger is on another machine); `write_log`
    puts them in the file later, each with the time it was logged."""

    def __init__(self, namespace: str = ""):
        self.path = None  # type: ignore[assignment]
        self.namespace = namespace
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []

    def close(self) -> None:
        pass

    def withhold(self, *keys: str) -> None:
        pass  # (its events reach the run's file only once the run ended: `write_log`)

    def _log(self, event_type: str, key: str, value: Any, metadata: dict | None,
             time_ms: float | None) -> None:
        line = self._line(event_type, key, value, metadata, time_ms)
        with self._lock:
            self.records.append(json.loads(line[len(TOKEN):]))


def write_log(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Write buffered events (MLBuffer.records) as a run's `:::MLLOG` file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(encode(r["namespace"], r["time_ms"], r["event_type"], r["key"], r["value"],
                           r["metadata"]) + "\n")


def begin_run(log: MLLogger, *, init_ms: float, benchmark: str, org: str, platform: str,
              division: str, run_id: int, level: int | None, backend: str | None,
              seed: int | None, hyperparameters: dict[str, Any],
              distributed: dict[str, Any] | None = None) -> None:
    """The opening of a run's log: init_start (at `init_ms`), the submission description, the
    seed and hyperparameters under MLPerf keys and d500's own keys; `started` closes it."""
    log.start(INIT_START, time_ms=init_ms)
    log.event(SUBMISSION_BENCHMARK, benchmark)
    log.event(SUBMISSION_ORG, org)
    log.event(SUBMISSION_PLATFORM, platform)
    log.event(SUBMISSION_DIVISION, division)
    log.event("d500_level", level)
    log.event("d500_backend", backend)
    log.event("d500_run_id", run_id)
    for key, value in (distributed or {}).items():
        if value is not None:
            log.event(f"d500_{key}", value)
    if seed is not None:
        log.event(SEED, seed)
    for name, value in hyperparameters.items():
        log.event(hyperparameter_key(name), value)


def started(log: MLLogger, time_ms: float | None = None) -> None:
    """init_stop then run_start (at `time_ms`, default now): the timed run begins."""
    log.end(INIT_STOP, time_ms=time_ms)
    log.start(RUN_START, time_ms=time_ms)


def result(log: MLLogger, name: str, value: float, unit: str) -> None:
    """A figure the run recorded (metric name -> value), with its unit."""
    log.event(name, value, metadata={"unit": unit})


def end_run(log: MLLogger, status: str) -> None:
    """run_stop with MLPerf's status (success / aborted) and d500's own, then close the file."""
    log.end(RUN_STOP, metadata={STATUS: SUCCESS if status == "succeeded" else ABORTED,
                                "d500_status": status})
    log.close()


def encode(namespace: str, time_ms: float, event_type: str, key: str, value: Any,
           metadata: dict) -> str:
    """One log line, fields in MLPerf's order; values that JSON cannot hold become strings."""
    record = {"namespace": namespace, "time_ms": int(time_ms), "event_type": event_type,
              "key": key, "value": jsonable(value), "metadata": jsonable(metadata)}
    return TOKEN + json.dumps(record, allow_nan=False)


def parse(path: str | Path) -> list[dict[str, Any]]:
    """Every `:::MLLOG` record of a file, in order (other lines are skipped); a `:::MLLOG` line
    that is not a record (see `parse_text`) is a ValueError naming the file and line."""
    records, bad = parse_text(Path(path).read_text(encoding="utf-8"))
    if bad:
        raise ValueError(f"{path}: line {bad[0][0]} is not an MLLOG record ({bad[0][1]})")
    return records


def parse_text(text: str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The `:::MLLOG` records of a log's text, in order, and (line number, why) of each
    `:::MLLOG` line that is not a record: a JSON object with a string `key`, a `value`, a finite
    number `time_ms` and an object `metadata`."""
    records, bad = [], []
    for at, line in enumerate(text.splitlines(), 1):
        if TOKEN not in line:
            continue
        try:
            record = json_value(line[line.index(TOKEN) + len(TOKEN):])
        except ValueError as err:
            bad.append((at, "not JSON" if isinstance(err, json.JSONDecodeError) else str(err)))
            continue
        why = _not_a_record(record)
        if why is None:
            records.append(record)
        else:
            bad.append((at, why))
    return records, bad


def _not_a_record(record: Any) -> str | None:
    """Why a parsed `:::MLLOG` line is not a record (None: it is one)."""
    from d500.ledger import finite
    if not isinstance(record, dict):
        return "not a JSON object"
    for field, ok, what in (("key", isinstance(record.get("key"), str), "a string"),
                            ("value", "value" in record, "present"),
                            ("time_ms", finite(record.get("time_ms")), "a finite number"),
                            ("metadata", isinstance(record.get("metadata"), dict), "an object")):
        if not ok:
            return f"its '{field}' is not {what}" if field in record else f"no '{field}'"
    return None


def jsonable(value: Any) -> Any:
    """A value as the log writes it: JSON types only (NumPy scalars as Python numbers, non-finite
    floats as the strings "inf", "-inf", "nan", paths and anything else as strings)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # NumPy scalars
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _caller() -> dict[str, Any]:
    frame = inspect.currentframe()
    try:
        while frame is not None and (frame.f_code.co_filename == _OWN_FILE
                                     or frame.f_code.co_filename.startswith(_LEDGER_DIR)):
            frame = frame.f_back
        if frame is None:
            return {"file": "?", "lineno": 0}
        return {"file": os.path.basename(frame.f_code.co_filename), "lineno": frame.f_lineno}
    finally:
        del frame
