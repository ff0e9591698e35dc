"""The SQLite ledger: every run of every level, its provenance, evaluations, artifacts and hashes.

INTERFACE (agreed between the levels; the implementation fills it in):

    from d500.ledger import Ledger
    ledger = Ledger()                       # $D500_HOME/ledger.sqlite, created on first use
    with ledger.start_run(level=0, workload="conv-3x3", submission="numpy-im2col-conv",
                          backend="numpy", seed=0, hyperparameters={...},
                          workload_file=path_or_None, submission_files=[paths],
                          model_file=path_or_None) as run:
        run.mllog.event("eval_accuracy", 0.93, metadata={"epoch_num": 3})  # MLLOG event
        run.evaluation(step=100, epoch=1, metrics={"val_accuracy": 0.9})   # time series
        run.artifact(path)                                                 # sha256 stored
        run.record(figures={"latency": 1.2e-3, ...}, details={...})        # metric name -> value
    # leaving the block: succeeded; an exception: failed (Diverged -> diverged,
    # KeyboardInterrupt -> interrupted) and the exception propagates.
    run.finish(status, figures=None, details=None, error=None) ends a run explicitly.

    ledger.runs(level=None, workload=None, status=None) -> list[dict]   # each with id, level,
        workload, submission, backend, status, seed, started, stopped, figures, details, ...
    ledger.get(run_id) -> dict
    ledger.verify() -> list[str]            # problems found; empty when intact

Figures are keyed by metric names defined in metrics/; an unknown name is a D500Error.

Extensions: `run.id`, `run.dir` (home/runs/<id>/, where mllog.txt lives), `run.elapsed()`
(seconds since the run started, for time-to-accuracy); a TimeoutError leaving the block ->
`timeout`. Tuning: `ledger.start_study(...)` -> Study; `study.trial(params, ...)` -> Run (a
ledger run linked to the study as trial N); `ledger.studies()`, `ledger.trials(study_id)`.
`ledger.verify_runs()` -> ({run_id: [problems]}, [problems not tied to a run]).

Robustness: WAL mode, a busy timeout and short IMMEDIATE transactions let several processes
write at once. A row is inserted as `running` with the writer's pid, host, boot id and process
start time; any reader shows a `running` row whose process no longer exists as `interrupted`,
and the next writer on that host seals it so. A finished row is sealed: the sha256 of each
field (evaluations and artifacts included) and a row hash chained to the previous sealed row.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import math
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from d500 import metrics as _metrics
from d500 import mllog as _mllog
from d500 import provenance as _provenance
from d500.errors import ConfigError, D500Error, Diverged, UsageError
from d500.paths import PROJECT_ROOT, home

T = TypeVar("T")
STATUSES = ("running", "succeeded", "failed", "diverged", "timeout", "interrupted")
FINAL = STATUSES[1:]
SCHEMA_VERSION = 1
GENESIS = "0" * 64
SEALED = ("level", "workload", "submission", "backend", "status", "seed", "started", "stopped",
          "hyperparameters", "figures", "details", "error", "env_id", "workload_file",
          "workload_text", "workload_sha256", "model_file", "model_sha256", "submission_files",
          "mllog", "pid", "host")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS environments (
    id INTEGER PRIMARY KEY, digest TEXT UNIQUE NOT NULL, provenance TEXT NOT NULL,
    recorded REAL NOT NULL);
CREATE TABLE IF NOT EXISTS studies (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, level INTEGER, workload TEXT, submission TEXT,
    backend TEXT, objective TEXT, search_space TEXT, budget TEXT, status TEXT NOT NULL,
    started REAL NOT NULL, stopped REAL, details TEXT, pid INTEGER, host TEXT, boot_id TEXT,
    proc_start TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, level INTEGER, workload TEXT, submission TEXT,
    backend TEXT, status TEXT NOT NULL, seed INTEGER, started REAL NOT NULL, stopped REAL,
    hyperparameters TEXT, figures TEXT, details TEXT, error TEXT,
    env_id INTEGER REFERENCES environments(id),
    pid INTEGER, host TEXT, boot_id TEXT, proc_start TEXT,
    workload_file TEXT, workload_text TEXT, workload_sha256 TEXT,
    model_file TEXT, model_sha256 TEXT, submission_files TEXT, mllog TEXT,
    chain_seq INTEGER UNIQUE, sealed TEXT, prev_hash TEXT, row_hash TEXT);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY, study_id INTEGER NOT NULL REFERENCES studies(id),
    number INTEGER NOT NULL, run_id INTEGER UNIQUE NOT NULL REFERENCES runs(id),
    params TEXT, UNIQUE (study_id, number));
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER,
    epoch REAL, wall_time REAL, metrics TEXT NOT NULL, recorded REAL NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), path TEXT NOT NULL,
    sha256 TEXT NOT NULL, bytes INTEGER, recorded REAL NOT NULL);
CREATE INDEX IF NOT EXISTS runs_by_workload ON runs (level, workload);
CREATE INDEX IF NOT EXISTS evaluations_by_run ON evaluations (run_id);
CREATE INDEX IF NOT EXISTS artifacts_by_run ON artifacts (run_id);
"""


# ---------------------------------------------------------------- small helpers

def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_default)


def _default(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def iso(t: float | None) -> str | None:
    """Unix seconds as an ISO-8601 UTC timestamp (milliseconds)."""
    if t is None:
        return None
    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat(timespec="milliseconds"
                                                                     ).replace("+00:00", "Z")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a Linux process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], fields[19]


def process_identity() -> dict[str, Any]:
    """What identifies this process across pid reuse and reboots."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
            "proc_start": stat[1] if stat else None}


def process_alive(pid: int | None, host: str | None, boot_id: str | None,
                  proc_start: str | None) -> bool | None:
    """Whether the process that wrote a row still runs: True, False, or None (another host)."""
    if pid is None or host != socket.gethostname():
        return None
    if boot_id and _boot_id() and boot_id != _boot_id():
        return False  # the machine rebooted since
    if Path("/proc/self/stat").exists():
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return False
        return proc_start is None or stat[1] == proc_start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _figures(values: dict[str, Any] | None, where: Any) -> dict[str, float]:
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


# ---------------------------------------------------------------- the ledger

def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """Serialise a method on the ledger's connection across threads (reads included)."""
    @functools.wraps(method)
    def wrapper(self: Ledger, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


class Ledger:
    """One SQLite file of runs; safe to use from several processes at once."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else home() / "ledger.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = self.path.parent.resolve()
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 60000")
            for _ in range(50):
                mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() == "wal":
                    break
                time.sleep(0.05)
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name='runs'").fetchone():
                with self._write() as db:
                    for statement in SCHEMA.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                               (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as err:
            raise D500Error(f"{self.path}: not a usable ledger database: {err}") from None
        self._db.row_factory = sqlite3.Row

    @classmethod
    def open_for_reading(cls, path: str | Path | None = None) -> Ledger:
        """The ledger a reader names (`--ledger FILE`), which must exist; default: $D500_HOME's."""
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{path}: no such ledger file")
        return cls(path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction, taken with the write lock up front (no upgrades)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- paths are stored relative to the ledger's folder or the project when inside them
    def store_path(self, path: str | Path) -> str:
        p = Path(path).resolve()
        if p.is_relative_to(self.root):
            return "$D500_HOME/" + p.relative_to(self.root).as_posix()
        if p.is_relative_to(PROJECT_ROOT):
            return p.relative_to(PROJECT_ROOT).as_posix()
        return str(p)

    def resolve_path(self, stored: str) -> Path:
        if stored.startswith("$D500_HOME/"):
            return self.root / stored[len("$D500_HOME/"):]
        p = Path(stored)
        return p if p.is_absolute() else PROJECT_ROOT / p

    # ------------------------------------------------------------ writing
    def start_run(self, level: int | None, workload: str, submission: str, backend: str | None,
                  seed: int | None = None, hyperparameters: dict[str, Any] | None = None,
                  workload_file: str | Path | None = None,
                  submission_files: Sequence[str | Path] = (),
                  model_file: str | Path | None = None,
                  study: Study | int | None = None, trial: int | None = None,
                  division: str = _mllog.CLOSED) -> Run:
        """Insert a `running` row (after sealing dead runs of this host) and open its MLLOG."""
        init_ms = time.time() * 1e3
        workload_text = workload_sha = None
        if workload_file is not None:
            wpath = Path(workload_file)
            try:
                raw = wpath.read_bytes()
                workload_text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(f"{wpath}: cannot read workload file: {err}") from None
            workload_sha = hashlib.sha256(raw).hexdigest()  # of the bytes, as verify hashes
            _check_workload_metrics(workload_text, wpath)
        files = self._hash_files(submission_files, "submission file")
        model_sha = None
        if model_file is not None:
            if not Path(model_file).is_file():
                raise ConfigError(f"{model_file}: no such model file")
            model_sha = sha256_file(model_file)
        provenance = _provenance.collect()
        ident = process_identity()
        self.reap()
        with self._write() as db:
            env_id = self._environment(db, provenance)
            cur = db.execute(
                "INSERT INTO runs (level, workload, submission, backend, status, seed, started,"
                " hyperparameters, figures, details, env_id, pid, host, boot_id, proc_start,"
                " workload_file, workload_text, workload_sha256, model_file, model_sha256,"
                " submission_files) VALUES (?,?,?,?, 'running', ?,?,?, '{}', '{}', ?,?,?,?,?,"
                " ?,?,?,?,?,?)",
                (level, workload, submission, backend, seed, time.time(),
                 _dumps(hyperparameters or {}), env_id, ident["pid"], ident["host"],
                 ident["boot_id"], ident["proc_start"],
                 None if workload_file is None else self.store_path(workload_file),
                 workload_text, workload_sha,
                 None if model_file is None else self.store_path(model_file), model_sha,
                 _dumps(files)))
            run_id = int(cur.lastrowid)
            study_id = study.id if isinstance(study, Study) else study
            if study_id is not None:
                if trial is None:
                    trial = db.execute("SELECT COALESCE(MAX(number), -1) + 1 FROM trials "
                                       "WHERE study_id = ?", (study_id,)).fetchone()[0]
                db.execute("INSERT INTO trials (study_id, number, run_id, params) "
                           "VALUES (?,?,?,?)", (study_id, trial, run_id,
                                                _dumps(hyperparameters or {})))
            run_dir = self.root / "runs" / str(run_id)
            log_path = run_dir / "mllog.txt"
            db.execute("UPDATE runs SET mllog = ? WHERE id = ?",
                       (self.store_path(log_path), run_id))
        run = Run(self, run_id, run_dir, log_path, workload_file)
        run._begin_log(init_ms, workload, submission, backend, level, seed,
                       hyperparameters or {}, provenance, division)
        return run

    def start_study(self, name: str, level: int | None, workload: str, submission: str,
                    backend: str | None, objective: str,
                    search_space: dict[str, Any] | None = None,
                    budget: dict[str, Any] | None = None) -> Study:
        """A tuning study: its trials are runs started with `study.trial(params, ...)`."""
        _metrics.get(objective)
        ident = process_identity()
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO studies (name, level, workload, submission, backend, objective,"
                " search_space, budget, status, started, details, pid, host, boot_id,"
                " proc_start) VALUES (?,?,?,?,?,?,?,?, 'running', ?, '{}', ?,?,?,?)",
                (name, level, workload, submission, backend, objective,
                 _dumps(search_space or {}), _dumps(budget or {}), time.time(), ident["pid"],
                 ident["host"], ident["boot_id"], ident["proc_start"]))
        return Study(self, int(cur.lastrowid), level, workload, submission, backend)

    def _hash_files(self, paths: Iterable[str | Path], what: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for p in paths:
            p = Path(p)
            if p.is_dir():
                members = sorted(f for f in p.rglob("*") if f.is_file()
                                 and "__pycache__" not in f.parts and f.suffix != ".pyc")
            elif p.is_file():
                members = [p]
            else:
                raise ConfigError(f"{p}: no such {what}")
            for f in members:
                found[self.store_path(f)] = sha256_file(f)
        return found

    def _environment(self, db: sqlite3.Connection, provenance: dict[str, Any]) -> int:
        text = _dumps(provenance)
        digest = _sha(text)
        db.execute("INSERT OR IGNORE INTO environments (digest, provenance, recorded) "
                   "VALUES (?,?,?)", (digest, text, time.time()))
        return int(db.execute("SELECT id FROM environments WHERE digest = ?",
                              (digest,)).fetchone()[0])

    def _finish(self, run_id: int, status: str, figures: dict[str, float] | None,
                details: dict[str, Any] | None, error: str | None,
                artifacts: Sequence[tuple[str, str, int]] = (),
                stopped: float | None = None) -> None:
        """Complete and seal a running row in one transaction (no-op if already finished)."""
        if status not in FINAL:
            raise D500Error(f"unknown run status '{status}' (choose from {', '.join(FINAL)})")
        with self._write() as db:
            row = db.execute("SELECT status, figures, details FROM runs WHERE id = ?",
                             (run_id,)).fetchone()
            if row is None or row[0] != "running":
                return
            figs = {**json.loads(row[1] or "{}"), **(figures or {})}
            dets = {**json.loads(row[2] or "{}"), **(details or {})}
            now = time.time()
            for path, digest, size in artifacts:
                db.execute("INSERT INTO artifacts (run_id, path, sha256, bytes, recorded) "
                           "VALUES (?,?,?,?,?)", (run_id, path, digest, size, now))
            db.execute("UPDATE runs SET status = ?, stopped = ?, figures = ?, details = ?,"
                       " error = ? WHERE id = ?",
                       (status, now if stopped is None else stopped, _dumps(figs),
                        _dumps(dets), error, run_id))
            self._seal(db, run_id)

    def _seal(self, db: sqlite3.Connection, run_id: int) -> None:
        fields = _field_hashes(db, run_id)
        sealed = _dumps(fields)
        last = db.execute("SELECT chain_seq, row_hash FROM runs WHERE chain_seq IS NOT NULL "
                          "ORDER BY chain_seq DESC LIMIT 1").fetchone()
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        row_hash = _row_hash(prev, run_id, sealed)
        db.execute("UPDATE runs SET chain_seq = ?, sealed = ?, prev_hash = ?, row_hash = ? "
                   "WHERE id = ?", (seq, sealed, prev, row_hash, run_id))
        db.execute("INSERT OR REPLACE INTO meta VALUES ('chain_head', ?)", (f"{seq} {row_hash}",))

    @_locked
    def reap(self) -> list[int]:
        """Seal as `interrupted` every running row (and study) of this host whose process died."""
        rows = self._db.execute("SELECT id, pid, host, boot_id, proc_start FROM runs "
                                "WHERE status = 'running' AND host = ?",
                                (socket.gethostname(),)).fetchall()
        dead = [r[0] for r in rows if process_alive(*tuple(r)[1:]) is False]
        for run_id in dead:
            last, log = self._db.execute(
                "SELECT MAX(t), (SELECT mllog FROM runs WHERE id = ?) FROM (SELECT started AS t "
                "FROM runs WHERE id = ? UNION ALL SELECT recorded FROM evaluations WHERE "
                "run_id = ?)", (run_id, run_id, run_id)).fetchone()
            log_path = self.resolve_path(log) if log else None
            arts = ([(log, sha256_file(log_path), log_path.stat().st_size)]
                    if log_path is not None and log_path.is_file() else [])
            self._finish(run_id, "interrupted", None,
                         {"interrupted": f"writer process died; detected {iso(time.time())}"},
                         "the process writing this run died before it finished", arts,
                         stopped=last)
        studies = self._db.execute("SELECT id, pid, host, boot_id, proc_start FROM studies "
                                   "WHERE status = 'running' AND host = ?",
                                   (socket.gethostname(),)).fetchall()
        for s in studies:
            if process_alive(*tuple(s)[1:]) is False:
                with self._write() as db:
                    db.execute("UPDATE studies SET status = 'interrupted' WHERE id = ? AND "
                               "status = 'running'", (s[0],))
        return dead

    # ------------------------------------------------------------ reading
    @_locked
    def runs(self, level: int | None = None, workload: str | None = None,
             status: str | None = None, submission: str | None = None,
             backend: str | None = None) -> list[dict[str, Any]]:
        """Runs, oldest first; `status` filters on the status every reader shows."""
        if status is not None and status not in STATUSES:
            raise UsageError(f"unknown status '{status}' (choose from {', '.join(STATUSES)})")
        where, args = [], []
        for col, val in (("level", level), ("workload", workload),
                         ("submission", submission), ("backend", backend)):
            if val is not None:
                where.append(f"r.{col} = ?")
                args.append(val)
        sql = ("SELECT r.*, t.study_id AS study, t.number AS trial FROM runs r "
               "LEFT JOIN trials t ON t.run_id = r.id")
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = [self._run_dict(r) for r in self._db.execute(sql + " ORDER BY r.id", args)]
        return [r for r in rows if status is None or r["status"] == status]

    @_locked
    def get(self, run_id: int | str) -> dict[str, Any]:
        """One run with its evaluations, artifacts and provenance; unknown ids are a UsageError."""
        try:
            rid = int(run_id)
        except (TypeError, ValueError):
            raise UsageError(f"run id must be a number, got '{run_id}'") from None
        row = self._db.execute("SELECT r.*, t.study_id AS study, t.number AS trial FROM runs r "
                               "LEFT JOIN trials t ON t.run_id = r.id WHERE r.id = ?",
                               (rid,)).fetchone()
        if row is None:
            raise UsageError(f"no run {rid} in the ledger {self.path}")
        run = self._run_dict(row)
        run["evaluations"] = self.evaluations(rid)
        run["artifacts"] = self.artifacts(rid)
        run["provenance"] = self.environment(run["environment"])
        return run

    @_locked
    def evaluations(self, run_id: int) -> list[dict[str, Any]]:
        return [{"step": r["step"], "epoch": r["epoch"], "wall_time": r["wall_time"],
                 "metrics": _loads(r["metrics"]), "recorded": iso(r["recorded"])}
                for r in self._db.execute("SELECT * FROM evaluations WHERE run_id = ? "
                                          "ORDER BY id", (run_id,))]

    @_locked
    def artifacts(self, run_id: int) -> list[dict[str, Any]]:
        return [{"path": r["path"], "sha256": r["sha256"], "bytes": r["bytes"],
                 "file": str(self.resolve_path(r["path"]))}
                for r in self._db.execute("SELECT * FROM artifacts WHERE run_id = ? "
                                          "ORDER BY id", (run_id,))]

    @_locked
    def environment(self, env_id: int | None) -> dict[str, Any] | None:
        if env_id is None:
            return None
        row = self._db.execute("SELECT provenance FROM environments WHERE id = ?",
                               (env_id,)).fetchone()
        return None if row is None else _loads(row[0])

    @_locked
    def environments(self) -> dict[int, dict[str, Any]]:
        return {r[0]: _loads(r[1]) for r in self._db.execute(
            "SELECT id, provenance FROM environments ORDER BY id")}

    @_locked
    def studies(self) -> list[dict[str, Any]]:
        out = []
        for r in self._db.execute("SELECT * FROM studies ORDER BY id"):
            d = dict(r)
            for key in ("search_space", "budget", "details"):
                d[key] = _loads(d[key])
            if d["status"] == "running" and process_alive(
                    d["pid"], d["host"], d["boot_id"], d["proc_start"]) is False:
                d["status"] = "interrupted"
            d["started"], d["stopped"] = iso(d["started"]), iso(d["stopped"])
            out.append(d)
        return out

    @_locked
    def trials(self, study_id: int) -> list[dict[str, Any]]:
        out = []
        for t in self._db.execute("SELECT * FROM trials WHERE study_id = ? ORDER BY number",
                                  (study_id,)).fetchall():
            run = self.runs_by_id([t["run_id"]])[0]
            out.append({"number": t["number"], "params": _loads(t["params"]), "run": run})
        return out

    @_locked
    def runs_by_id(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        marks = ",".join("?" * len(ids))
        return [self._run_dict(r) for r in self._db.execute(
            f"SELECT r.*, t.study_id AS study, t.number AS trial FROM runs r LEFT JOIN trials t"
            f" ON t.run_id = r.id WHERE r.id IN ({marks}) ORDER BY r.id", list(ids))]

    def _run_dict(self, r: sqlite3.Row) -> dict[str, Any]:
        status = r["status"]
        if status == "running" and process_alive(r["pid"], r["host"], r["boot_id"],
                                                  r["proc_start"]) is False:
            status = "interrupted"
        started, stopped = r["started"], r["stopped"]
        return {
            "id": r["id"], "level": r["level"], "workload": r["workload"],
            "submission": r["submission"], "backend": r["backend"], "status": status,
            "recorded_status": r["status"], "seed": r["seed"],
            "started": iso(started), "stopped": iso(stopped),
            "started_unix": started, "stopped_unix": stopped,
            "duration": None if stopped is None else stopped - started,
            "hyperparameters": _loads(r["hyperparameters"]) or {},
            "figures": _loads(r["figures"]) or {}, "details": _loads(r["details"]) or {},
            "error": r["error"], "environment": r["env_id"], "study": r["study"],
            "trial": r["trial"], "pid": r["pid"], "host": r["host"],
            "workload_file": r["workload_file"], "workload_text": r["workload_text"],
            "workload_sha256": r["workload_sha256"], "model_file": r["model_file"],
            "model_sha256": r["model_sha256"],
            "submission_files": _loads(r["submission_files"]) or {}, "mllog": r["mllog"],
            "sealed": r["row_hash"] is not None,
        }

    # ------------------------------------------------------------ integrity
    def verify(self) -> list[str]:
        """Every problem found: changed rows, broken chain, changed or missing files."""
        per_run, general = self.verify_runs()
        return general + [p for run_id in sorted(per_run) for p in per_run[run_id]]

    @_locked
    def verify_runs(self) -> tuple[dict[int, list[str]], list[str]]:
        """({run id: problems} for every run, [problems not tied to one run]), read from one
        consistent snapshot while other processes keep writing."""
        self._db.execute("BEGIN")
        try:
            return self._verify_snapshot()
        finally:
            self._db.execute("COMMIT")

    def _verify_snapshot(self) -> tuple[dict[int, list[str]], list[str]]:
        per_run: dict[int, list[str]] = {}
        general: list[str] = []
        hashes: dict[Path, str | None] = {}

        def file_changed(stored: str, recorded: str, what: str) -> str | None:
            path = self.resolve_path(stored)
            if path not in hashes:
                hashes[path] = sha256_file(path) if path.is_file() else None
            if hashes[path] is None:
                return f"{what} {path} is missing"
            if hashes[path] != recorded:
                return (f"{what} {path} changed since it was recorded "
                        f"(sha256 {recorded[:12]}… now {hashes[path][:12]}…)")
            return None

        for env in self._db.execute("SELECT id, digest, provenance FROM environments"):
            if _sha(env[2]) != env[1]:
                general.append(f"environment {env[0]}: provenance changed since it was recorded")
        prev_hash, expected_seq = GENESIS, 1
        rows = self._db.execute("SELECT * FROM runs ORDER BY chain_seq IS NULL, chain_seq, id"
                                ).fetchall()
        for r in rows:
            rid = r["id"]
            problems = per_run.setdefault(rid, [])
            if r["chain_seq"] is None:
                if r["status"] != "running":
                    problems.append(f"run {rid}: status '{r['status']}' but the row was never "
                                    "sealed (edited in the database?)")
                continue
            if r["chain_seq"] != expected_seq:
                general.append(f"chain: sealed rows {expected_seq}..{r['chain_seq'] - 1} are "
                               f"missing before run {rid} (deleted from the database?)")
            expected_seq = r["chain_seq"] + 1
            if r["prev_hash"] != prev_hash:
                problems.append(f"run {rid}: chain link to the previous row is broken "
                                "(a row before it was changed or removed)")
            try:
                recorded = json.loads(r["sealed"])
            except (TypeError, ValueError):
                recorded = {}
            if _row_hash(r["prev_hash"], rid, r["sealed"] or "") != r["row_hash"]:
                problems.append(f"run {rid}: row hash does not match (its seal was edited)")
            current = _field_hashes(self._db, rid)
            changed = [k for k in current if recorded.get(k) != current[k]]
            if changed:
                problems.append(f"run {rid}: {', '.join(changed)} changed in the database "
                                "since the run was recorded")
            prev_hash = r["row_hash"]
            checks = [(r["workload_file"], r["workload_sha256"], "workload file"),
                      (r["model_file"], r["model_sha256"], "model file")]
            checks += [(p, h, "submission file")
                       for p, h in (_loads(r["submission_files"]) or {}).items()]
            checks += [(a[0], a[1], "artifact") for a in self._db.execute(
                "SELECT path, sha256 FROM artifacts WHERE run_id = ?", (rid,))]
            for stored, digest, what in checks:
                if stored and digest:
                    found = file_changed(stored, digest, what)
                    if found:
                        problems.append(f"run {rid}: {found}")
        head = self._db.execute("SELECT value FROM meta WHERE key = 'chain_head'").fetchone()
        if head is not None:
            head_seq, head_hash = head[0].split()
            if int(head_seq) >= expected_seq:
                general.append(f"chain: the last sealed rows {expected_seq}..{head_seq} are "
                               "missing (deleted from the database?)")
            elif int(head_seq) == expected_seq - 1 and head_hash != prev_hash:
                general.append("chain: the last sealed row does not match the recorded chain "
                               "head")
        return per_run, general


def _field_hashes(db: sqlite3.Connection, run_id: int) -> dict[str, str]:
    row = db.execute(f"SELECT {', '.join(SEALED)} FROM runs WHERE id = ?", (run_id,)).fetchone()
    fields = {name: _sha(json.dumps(row[i])) for i, name in enumerate(SEALED)}
    evals = db.execute("SELECT step, epoch, wall_time, metrics, recorded FROM evaluations "
                       "WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
    arts = db.execute("SELECT path, sha256, bytes FROM artifacts WHERE run_id = ? ORDER BY id",
                      (run_id,)).fetchall()
    trial = db.execute("SELECT study_id, number, params FROM trials WHERE run_id = ?",
                       (run_id,)).fetchone()
    fields["evaluations"] = _sha(json.dumps([list(e) for e in evals]))
    fields["artifacts"] = _sha(json.dumps([list(a) for a in arts]))
    fields["trial"] = _sha(json.dumps(None if trial is None else list(trial)))
    return fields


def _row_hash(prev_hash: str, run_id: int, sealed: str) -> str:
    return _sha(f"{prev_hash}|{run_id}|{sealed}")


def _check_workload_metrics(text: str, path: Path) -> None:
    """The metrics (and rank_by) a workload file names must be defined in metrics/."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(data, dict):
        return
    names = data.get("metrics") or []
    if not isinstance(names, list):
        raise ConfigError(f"{path}: field 'metrics' must be a list of metric names")
    for name in [*names, *([data["rank_by"]] if data.get("rank_by") else [])]:
        _metrics.get(str(name), path)


# ---------------------------------------------------------------- runs and studies

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
        self._artifacts: list[tuple[str, str, int]] = []

    def elapsed(self) -> float:
        """Seconds of wall time since the run started."""
        return time.perf_counter() - self._t0

    def _begin_log(self, init_ms: float, workload: str, submission: str, backend: str | None,
                   level: int | None, seed: int | None, hyperparameters: dict[str, Any],
                   provenance: dict[str, Any], division: str) -> None:
        log = self.mllog
        log.start(_mllog.INIT_START, time_ms=init_ms)
        log.event(_mllog.SUBMISSION_BENCHMARK, workload)
        log.event(_mllog.SUBMISSION_ORG, submission)
        log.event(_mllog.SUBMISSION_PLATFORM, _provenance.summary(provenance))
        log.event(_mllog.SUBMISSION_DIVISION, division)
        log.event("d500_level", level)
        log.event("d500_backend", backend)
        log.event("d500_run_id", self.id)
        if seed is not None:
            log.event(_mllog.SEED, seed)
        for name, value in hyperparameters.items():
            log.event(_mllog.hyperparameter_key(name), value)
        log.end(_mllog.INIT_STOP)
        log.start(_mllog.RUN_START)

    def record(self, figures: dict[str, Any] | None = None,
               details: dict[str, Any] | None = None) -> None:
        """Store figures (metric name -> number) and details now; later calls merge."""
        figs = _figures(figures, self.workload_file)
        with self.ledger._write() as db:
            row = db.execute("SELECT status, figures, details FROM runs WHERE id = ?",
                             (self.id,)).fetchone()
            if row[0] != "running":
                raise D500Error(f"run {self.id} is already {row[0]}; cannot record figures")
            db.execute("UPDATE runs SET figures = ?, details = ? WHERE id = ?",
                       (_dumps({**json.loads(row[1]), **figs}),
                        _dumps({**json.loads(row[2]), **(details or {})}), self.id))
        for name, value in figs.items():
            self.mllog.event(name, value, metadata={"unit": _metrics.get(name).unit})

    def evaluation(self, step: int | None = None, epoch: float | None = None,
                   metrics: dict[str, Any] | None = None,
                   wall_time: float | None = None) -> None:
        """One point of the evaluation time series (wall time defaults to now - run start)."""
        values = _figures(metrics, self.workload_file)
        with self.ledger._write() as db:
            db.execute("INSERT INTO evaluations (run_id, step, epoch, wall_time, metrics,"
                       " recorded) VALUES (?,?,?,?,?,?)",
                       (self.id, step, epoch, self.elapsed() if wall_time is None else wall_time,
                        _dumps(values), time.time()))

    def artifact(self, path: str | Path) -> str:
        """Register a file this run wrote; its sha256 is stored when the run finishes."""
        p = Path(path)
        if not p.is_file():
            raise D500Error(f"artifact {p}: no such file")
        digest = sha256_file(p)
        self._artifacts.append((self.ledger.store_path(p), digest, p.stat().st_size))
        return digest

    def finish(self, status: str = "succeeded", figures: dict[str, Any] | None = None,
               details: dict[str, Any] | None = None, error: str | None = None) -> None:
        """End the run: write run_stop to its MLLOG, store its artifacts, seal the row."""
        if self.status != "running":
            return
        if status not in FINAL:
            raise D500Error(f"unknown run status '{status}' (choose from {', '.join(FINAL)})")
        figs = _figures(figures, self.workload_file)
        for name, value in figs.items():
            self.mllog.event(name, value, metadata={"unit": _metrics.get(name).unit})
        self.mllog.end(_mllog.RUN_STOP, metadata={
            _mllog.STATUS: _mllog.SUCCESS if status == "succeeded" else _mllog.ABORTED,
            "d500_status": status})
        self.mllog.close()
        path = self.mllog.path
        arts = [*self._artifacts,
                (self.ledger.store_path(path), sha256_file(path), path.stat().st_size)]
        self.ledger._finish(self.id, status, figs, details, error, arts)
        self.status = status

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
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
                       "AND status = 'running'", (status, time.time(), _dumps(details or {}),
                                                  self.id))

    def __enter__(self) -> Study:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.finish("succeeded")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("interrupted")
        else:
            self.finish("failed", {"error": f"{exc_type.__name__}: {exc}"})


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
