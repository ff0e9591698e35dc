"""Recording runs: start a run (or a tuning study and its trials), record figures, evaluations and
artifacts while it runs, finish and seal it; seal as interrupted the runs whose writer died."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from d500 import metrics as _metrics
from d500 import mllog as _mllog
from d500.errors import D500Error, Diverged
from d500.ledger import integrity, liveness
from d500.ledger.store import dumps

if TYPE_CHECKING:
    import sqlite3

    from d500.ledger.core import Ledger
    from d500.ledger.start import RunFields

STATUSES = ("running", "succeeded", "failed", "diverged", "missed", "timeout", "interrupted")
FINAL = STATUSES[1:]

# How d500.training.tuning.study_name writes a study's place in its tuning ("study 2 of 3").
_STUDY_OF = re.compile(r": study (\d+) of \d+,")


def study_number(name: str | None) -> int | None:
    """A study's number in its entry's tuning of one workload on one backend, counted from 0
    as its trials are (the Halton plan's study index), read from the study's name; None for a
    study not named by `d500 tune`."""
    found = _STUDY_OF.search(name or "")
    return None if found is None else int(found.group(1)) - 1


def trial_label(number: int | None, trial: int | None, study_id: int | None = None) -> str:
    """The one name of a tuning trial everywhere (tune, `ledger list/show`, check, reproduce):
    "study S trial T", both counted from 0; a study not named by `d500 tune` by its id."""
    study = f"study {number}" if number is not None else f"study id {study_id}"
    return f"{study} trial {trial}"


def iso(t: float | None) -> str | None:
    """Unix seconds as an ISO-8601 UTC timestamp (milliseconds)."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds"
                                                            ).replace("+00:00", "Z")


def check_figures(values: dict[str, Any] | None, where: Any) -> dict[str, float]:
    """Figures checked: each name a metric defined in metrics/, each value a number."""
    out: dict[str, float] = {}
    for name, value in (values or {}).items():
        _metrics.get(name, where)
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise D500Error(f"figure '{name}' must be a number, got {type(value).__name__} "
                            f"{value!r}")
        out[name] = float(value)
    return out


def placement(group: str | int | None, rank: int | None, world_size: int | None,
              parent: Run | int | None) -> tuple[str | None, int | None, int | None, int | None]:
    """(run_group, rank, world_size, parent_run) as stored, checked: rank needs world_size and
    0 <= rank < world_size; a group is text (an int becomes its decimal string)."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise D500Error(f"run {name} must be an integer, got {value!r}")
    if world_size is not None and world_size < 1:
        raise D500Error(f"run world_size must be at least 1, got {world_size}")
    if rank is not None and (world_size is None or not 0 <= rank < world_size):
        raise D500Error(f"run rank {rank} needs a world_size above it (world_size "
                        f"{world_size})")
    if group is not None and (isinstance(group, bool) or not isinstance(group, (str, int))
                              or str(group) == ""):
        raise D500Error(f"run group must be a non-empty string or an integer, got {group!r}")
    parent_id = parent.id if isinstance(parent, Run) else parent
    if parent_id is not None and (isinstance(parent_id, bool) or not isinstance(parent_id, int)):
        raise D500Error(f"parent run must be a run id, got {parent!r}")
    return None if group is None else str(group), rank, world_size, parent_id


def insert_run(ledger: Ledger, fields: RunFields, study: Study | int | None,
               trial: int | None) -> Run:
    """Insert a prepared run's `running` row (after sealing dead runs of this host), linked to
    its study trial; the Run returned has not begun its MLLOG."""
    ident = liveness.process_identity()
    ledger.reap()
    with ledger._write() as db:
        if fields.parent is not None and not db.execute("SELECT 1 FROM runs WHERE id = ?",
                                                        (fields.parent,)).fetchone():
            raise D500Error(f"parent run {fields.parent}: no such run in the ledger "
                            f"{ledger.path}")
        env_id = environment_id(db, fields.provenance)
        cur = db.execute(
            "INSERT INTO runs (level, workload, submission, backend, status, seed, started,"
            " hyperparameters, figures, details, env_id, pid, host, boot_id, proc_start,"
            " workload_file, workload_text, workload_sha256, model_file, model_sha256,"
            " submission_files, run_group, rank, world_size, parent_run)"
            " VALUES (?,?,?,?, 'running', ?,?,?, '{}', '{}', ?,?,?,?,?, ?,?,?,?,?,?, ?,?,?,?)",
            (fields.level, fields.workload, fields.submission, fields.backend, fields.seed,
             time.time(), dumps(fields.hyperparameters), env_id, ident["pid"], ident["host"],
             ident["boot_id"], ident["proc_start"], fields.workload_file, fields.workload_text,
             fields.workload_sha256, fields.model_file, fields.model_sha256,
             dumps(fields.submission_files), fields.group, fields.rank, fields.world_size,
             fields.parent))
        run_id = int(cur.lastrowid)  # type: ignore[arg-type]
        link_trial(db, study, trial, run_id, fields.hyperparameters)
        run_dir = ledger.root / "runs" / str(run_id)
        log_path = run_dir / "mllog.txt"
        db.execute("UPDATE runs SET mllog = ? WHERE id = ?", (ledger.store_path(log_path),
                                                               run_id))
    return Run(ledger, run_id, run_dir, log_path, fields.workload_path)


def start_study(ledger: Ledger, name: str, level: int | None, workload: str, submission: str,
                backend: str | None, objective: str, search_space: dict[str, Any] | None,
                budget: dict[str, Any] | None) -> Study:
    """A tuning study: its trials are runs started with `study.trial(params, ...)`."""
    _metrics.get(objective)
    ident = liveness.process_identity()
    with ledger._write() as db:
        cur = db.execute(
            "INSERT INTO studies (name, level, workload, submission, backend, objective,"
            " search_space, budget, status, started, details, pid, host, boot_id,"
            " proc_start) VALUES (?,?,?,?,?,?,?,?, 'running', ?, '{}', ?,?,?,?)",
            (name, level, workload, submission, backend, objective, dumps(search_space or {}),
             dumps(budget or {}), time.time(), ident["pid"], ident["host"], ident["boot_id"],
             ident["proc_start"]))
    return Study(ledger, int(cur.lastrowid), level, workload,  # type: ignore[arg-type]
                 submission, backend)


def open_study(ledger: Ledger, name: str, level: int | None, workload: str, submission: str,
               backend: str | None, objective: str, search_space: dict[str, Any] | None,
               budget: dict[str, Any] | None) -> Study:
    """The study called `name` of this entry, reopened by this process (a resumed tuning), or
    a new one. Its trials so far stay; the caller decides which to run again."""
    with ledger._write() as db:
        row = db.execute("SELECT id FROM studies WHERE name = ? AND workload IS ? AND "
                         "submission IS ? AND backend IS ? ORDER BY id DESC LIMIT 1",
                         (name, workload, submission, backend)).fetchone()
        if row is not None:
            ident = liveness.process_identity()
            db.execute("UPDATE studies SET status = 'running', stopped = NULL, pid = ?, "
                       "host = ?, boot_id = ?, proc_start = ? WHERE id = ?",
                       (ident["pid"], ident["host"], ident["boot_id"], ident["proc_start"],
                        row[0]))
            return Study(ledger, int(row[0]), level, workload, submission, backend)
    return start_study(ledger, name, level, workload, submission, backend, objective,
                       search_space, budget)


def link_trial(db: sqlite3.Connection, study: Study | int | None, trial: int | None,
               run_id: int, params: dict[str, Any]) -> None:
    """Make a run trial `trial` of a study (the next number when None; a number already tried
    gets its next attempt), inside the caller's write transaction; no study, no link."""
    study_id = study.id if isinstance(study, Study) else study
    if study_id is None:
        return
    if trial is None:
        trial = db.execute("SELECT COALESCE(MAX(number), -1) + 1 FROM trials "
                           "WHERE study_id = ?", (study_id,)).fetchone()[0]
    attempt = db.execute("SELECT COALESCE(MAX(attempt), -1) + 1 FROM trials WHERE "
                         "study_id = ? AND number = ?", (study_id, trial)).fetchone()[0]
    db.execute("INSERT INTO trials (study_id, number, run_id, params, attempt) "
               "VALUES (?,?,?,?,?)", (study_id, trial, run_id, dumps(params), attempt))


def environment_id(db: sqlite3.Connection, provenance: dict[str, Any] | str) -> int:
    """The id of a provenance record, inserted once per distinct environment (given as text:
    stored exactly so, as a package carries another ledger's)."""
    text = provenance if isinstance(provenance, str) else dumps(provenance)
    digest = integrity.sha(text)
    db.execute("INSERT OR IGNORE INTO environments (digest, provenance, recorded) "
               "VALUES (?,?,?)", (digest, text, time.time()))
    return int(db.execute("SELECT id FROM environments WHERE digest = ?",
                          (digest,)).fetchone()[0])


def finish(ledger: Ledger, run_id: int, status: str, figs: dict[str, float] | None,
           details: dict[str, Any] | None, error: str | None,
           artifacts: Sequence[tuple[str, str, int]] = (), stopped: float | None = None) -> None:
    """Complete and seal a running row in one transaction (no-op if already finished)."""
    if status not in FINAL:
        raise D500Error(f"unknown run status '{status}' (choose from {', '.join(FINAL)})")
    with ledger._write() as db:
        row = db.execute("SELECT status, figures, details FROM runs WHERE id = ?",
                         (run_id,)).fetchone()
        if row is None or row[0] != "running":
            return
        merged = {**json.loads(row[1] or "{}"), **(figs or {})}
        dets = {**json.loads(row[2] or "{}"), **(details or {})}
        now = time.time()
        for path, digest, size in artifacts:
            db.execute("INSERT INTO artifacts (run_id, path, sha256, bytes, recorded) "
                       "VALUES (?,?,?,?,?)", (run_id, path, digest, size, now))
        db.execute("UPDATE runs SET status = ?, stopped = ?, figures = ?, details = ?,"
                   " error = ? WHERE id = ?", (status, now if stopped is None else stopped,
                                               dumps(merged), dumps(dets), error, run_id))
        integrity.seal(db, run_id)


def reap(ledger: Ledger) -> list[int]:
    """Seal as `interrupted` every running row (and study) of this host whose process died."""
    host = socket.gethostname()
    with ledger._lock:
        rows = ledger._db.execute("SELECT id, pid, host, boot_id, proc_start FROM runs "
                                  "WHERE status = 'running' AND host = ?", (host,)).fetchall()
        dead = liveness.dead_writers(rows)
        for run_id in dead:
            last, log = ledger._db.execute(
                "SELECT MAX(t), (SELECT mllog FROM runs WHERE id = ?) FROM (SELECT started AS t "
                "FROM runs WHERE id = ? UNION ALL SELECT recorded FROM evaluations WHERE "
                "run_id = ?)", (run_id, run_id, run_id)).fetchone()
            log_path = ledger.resolve_path(log) if log else None
            arts = ([(log, integrity.sha256_file(log_path), log_path.stat().st_size)]
                    if log_path is not None and log_path.is_file() else [])
            finish(ledger, run_id, "interrupted", None,
                   {"interrupted": f"writer process died; detected {iso(time.time())}"},
                   "the process writing this run died before it finished", arts, stopped=last)
        studies = ledger._db.execute("SELECT id, pid, host, boot_id, proc_start FROM studies "
                                     "WHERE status = 'running' AND host = ?", (host,)).fetchall()
        for study_id in liveness.dead_writers(studies):
            with ledger._write() as db:
                db.execute("UPDATE studies SET status = 'interrupted' WHERE id = ? AND "
                           "status = 'running'", (study_id,))
    return dead


class Run:
    """A run being recorded; a context manager that finishes it on leaving the block."""

    def __init__(self, ledger: Ledger, run_id: int, run_dir: Path, log_path: Path,
                 workload_file: str | Path | None):
        self.ledger, self.id, self.dir = ledger, run_id, run_dir
        self.workload_file = workload_file
        self.mllog = _mllog.MLLogger(log_path)
        self.started = time.time()
        self._t0 = time.perf_counter()
        self.status: str = "running"
        self._begun = False
        self._artifacts: list[tuple[str, str, int]] = []

    def begin(self) -> float:
        """End initialisation: init_stop and run_start in the MLLOG, and elapsed() restarts at 0.
        Done by start_run unless it was given begin=False; later calls change nothing. Returns
        the perf_counter reading taken at run_start's timestamp, where a trainer's clock starts,
        so the log's times and the clock's agree by construction (d500 check compares them)."""
        if not self._begun:
            wall, self._t0 = time.time(), time.perf_counter()
            _mllog.started(self.mllog, wall * 1e3)
            self._begun = True
        return self._t0

    def elapsed(self) -> float:
        """Seconds of wall time since run_start (begin())."""
        return time.perf_counter() - self._t0

    def record(self, figures: dict[str, Any] | None = None,
               details: dict[str, Any] | None = None) -> None:
        """Store figures (metric name -> number) and details now; later calls merge."""
        figs = check_figures(figures, self.workload_file)
        with self.ledger._write() as db:
            row = db.execute("SELECT status, figures, details FROM runs WHERE id = ?",
                             (self.id,)).fetchone()
            if row[0] != "running":
                raise D500Error(f"run {self.id} is already {row[0]}; cannot record figures")
            db.execute("UPDATE runs SET figures = ?, details = ? WHERE id = ?",
                       (dumps({**json.loads(row[1]), **figs}),
                        dumps({**json.loads(row[2]), **(details or {})}), self.id))
        for name, value in figs.items():
            _mllog.result(self.mllog, name, value, _metrics.get(name).unit)

    def evaluation(self, step: int | None = None, epoch: float | None = None,
                   metrics: dict[str, Any] | None = None,
                   wall_time: float | None = None, recorded: float | None = None) -> None:
        """One point of the evaluation time series (wall time defaults to now - run start;
        `recorded`, unix s, to now: a row written after the evaluation gives its time)."""
        values = check_figures(metrics, self.workload_file)
        with self.ledger._write() as db:
            db.execute("INSERT INTO evaluations (run_id, step, epoch, wall_time, metrics,"
                       " recorded) VALUES (?,?,?,?,?,?)",
                       (self.id, step, epoch, self.elapsed() if wall_time is None else wall_time,
                        dumps(values), time.time() if recorded is None else recorded))

    def artifact(self, path: str | Path) -> str:
        """Register a file this run wrote; its sha256 is stored when the run finishes."""
        p = Path(path)
        if not p.is_file():
            raise D500Error(f"artifact {p}: no such file")
        digest = integrity.sha256_file(p)
        self._keep_artifact(self.store_path(p), digest, p.stat().st_size)
        return digest

    def store_path(self, path: str | Path) -> str:
        """How this run's ledger stores a path (relative to $D500_HOME or the project)."""
        return self.ledger.store_path(path)

    def finish(self, status: str = "succeeded", figures: dict[str, Any] | None = None,
               details: dict[str, Any] | None = None, error: str | None = None) -> None:
        """End the run: write run_stop to its MLLOG, store its artifacts, seal the row."""
        if self.status != "running":
            return
        if status not in FINAL:
            raise D500Error(f"unknown run status '{status}' (choose from {', '.join(FINAL)})")
        figs = check_figures(figures, self.workload_file)
        self.mllog.release()  # the lines withheld while the entry's code ran (MLLogger.withhold)
        for name, value in figs.items():
            _mllog.result(self.mllog, name, value, _metrics.get(name).unit)
        _mllog.end_run(self.mllog, status)
        self._store(status, figs, details or {}, error)
        self.status = status

    # -- where a finished run goes (a RelayRun keeps it in memory instead) ------------------
    def _keep_artifact(self, stored: str, digest: str, size: int) -> None:
        self._artifacts.append((stored, digest, size))

    def _store(self, status: str, figures: dict[str, float], details: dict[str, Any],
               error: str | None) -> None:
        path = self.mllog.path
        arts = [*self._artifacts, (self.ledger.store_path(path), integrity.sha256_file(path),
                                   path.stat().st_size)]
        finish(self.ledger, self.id, status, figures, details, error, arts)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.finish("succeeded")
        elif issubclass(exc_type, Diverged):
            self.finish("diverged", error=str(exc))
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("interrupted", error="KeyboardInterrupt")
        elif issubclass(exc_type, TimeoutError):
            self.finish("timeout", error=str(exc) or "timeout")
        else:
            self.finish("failed", error=f"{exc_type.__name__}: {exc}")


class Study:
    """A tuning study; every trial is a ledger run (failed and diverged ones included)."""

    def __init__(self, ledger: Ledger, study_id: int, level: int | None, workload: str,
                 submission: str, backend: str | None):
        self.ledger, self.id = ledger, study_id
        self.level, self.workload, self.submission, self.backend = (
            level, workload, submission, backend)

    def trial(self, params: dict[str, Any], **kwargs: Any) -> Run:
        """Start the next trial's run (keyword arguments as for Ledger.start_run)."""
        kwargs.setdefault("level", self.level)
        kwargs.setdefault("workload", self.workload)
        kwargs.setdefault("submission", self.submission)
        kwargs.setdefault("backend", self.backend)
        return self.ledger.start_run(hyperparameters=params, study=self, **kwargs)

    def finish(self, status: str = "succeeded", details: dict[str, Any] | None = None) -> None:
        if status not in FINAL:
            raise D500Error(f"unknown study status '{status}'")
        with self.ledger._write() as db:
            db.execute("UPDATE studies SET status = ?, stopped = ?, details = ? WHERE id = ? "
                       "AND status = 'running'", (status, time.time(), dumps(details or {}),
                                                  self.id))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.finish("succeeded")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("interrupted")
        else:
            self.finish("failed", {"error": f"{exc_type.__name__}: {exc}"})
