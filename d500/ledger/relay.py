"""Recording a run in a process that cannot reach the ledger (an MPI rank on another machine): a
Relay stands in for the Ledger, its runs keep everything in a plain record, and the process
that holds the ledger writes that record later with `Ledger.import_run(record)`.

    relay = Relay()
    with relay.start_run(level=2, workload=..., ..., study=study_id, trial=3,
                         group="tune ...", rank=1, world_size=4, begin=False) as run:
        run.mllog.event(...); run.begin(); run.evaluation(...); run.finish("missed", ...)
    record = relay.take()      # a dict of str, numbers, lists and dicts (pickle or JSON it)
    ...                        # on the ledger's process:
    run_id = ledger.import_run(record)

The record keeps what the writing process would have stored: its own start and stop times,
host, pid and provenance, the MLLOG events with the times they were logged, every evaluation
with its wall time, the figures, status and error, and the files it hashed (paths stored as a
ledger in its D500_HOME would store them). The imported row is sealed like any other, so
`d500 ledger verify` covers it; its MLLOG file and the row's `d500_run_id` get the new run id.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from d500 import metrics as _metrics
from d500 import mllog as _mllog
from d500.errors import D500Error
from d500.ledger import integrity, liveness
from d500.ledger.lifecycle import (
    FINAL,
    Run,
    Study,
    check_figures,
    environment_id,
    link_trial,
    placement,
)
from d500.ledger.start import RunFields, RunStarter
from d500.ledger.store import dumps, stored_path
from d500.paths import home

if TYPE_CHECKING:
    import sqlite3

    from d500.ledger.core import Ledger

FORMAT = 1  # the record's layout; import_run refuses others
KEYS = ("relay", "level", "workload", "submission", "backend", "seed", "hyperparameters",
        "workload_file", "workload_text", "workload_sha256", "model_file", "model_sha256",
        "submission_files", "study", "trial", "group", "rank", "world_size", "parent",
        "started", "stopped", "status", "figures", "details", "error", "evaluations",
        "artifacts", "mllog", "provenance", "process")


class Relay(RunStarter["RelayRun"]):
    """The part of the Ledger a trainer uses (`start_run`, with the Ledger's checks), recording
    in memory: each finished run's record waits in `finished` (or `take()`) for the process
    that holds the ledger."""

    def __init__(self) -> None:
        self.root = home().resolve()  # where this process's own ledger would live
        self.finished: list[dict[str, Any]] = []

    def store_path(self, path: str | Path) -> str:
        return stored_path(path, self.root)

    def _open_run(self, fields: RunFields, study: Study | int | None,
                  trial: int | None) -> RelayRun:
        """The run's record (`study` is a study id of the ledger it will be imported into; a
        Study is taken by its id), kept by a RelayRun."""
        record: dict[str, Any] = {
            "relay": FORMAT, "level": fields.level, "workload": fields.workload,
            "submission": fields.submission, "backend": fields.backend, "seed": fields.seed,
            "hyperparameters": fields.hyperparameters, "workload_file": fields.workload_file,
            "workload_text": fields.workload_text, "workload_sha256": fields.workload_sha256,
            "model_file": fields.model_file, "model_sha256": fields.model_sha256,
            "submission_files": fields.submission_files,
            "study": study.id if isinstance(study, Study) else study, "trial": trial,
            "group": fields.group, "rank": fields.rank, "world_size": fields.world_size,
            "parent": fields.parent, "started": time.time(), "stopped": None,
            "status": "running", "figures": {}, "details": {}, "error": None,
            "evaluations": [], "artifacts": [], "mllog": [], "provenance": fields.provenance,
            "process": liveness.process_identity()}
        return RelayRun(self, record, fields.workload_path)

    def take(self) -> dict[str, Any]:
        """The oldest finished run's record, removed from the relay."""
        if not self.finished:
            raise D500Error("the relay holds no finished run")
        return self.finished.pop(0)


class RelayRun(Run):
    """A Run recorded in memory (a Run's begin, elapsed and context-manager exit statuses);
    `id` is None until the record is imported."""

    def __init__(self, relay: Relay, record: dict[str, Any], workload_file: str | Path | None):
        self.relay, self.id, self.dir = relay, None, None  # type: ignore[assignment]
        self.workload_file = workload_file
        self.mllog = _mllog.MLBuffer()
        record["mllog"] = self.mllog.records
        self.fields = record
        self.started = record["started"]
        self._t0 = time.perf_counter()
        self.status = "running"
        self._begun = False

    def record(self, figures: dict[str, Any] | None = None,
               details: dict[str, Any] | None = None) -> None:
        figs = check_figures(figures, self.workload_file)
        self._running("record figures")
        self.fields["figures"].update(figs)
        self.fields["details"].update(details or {})
        for name, value in figs.items():
            _mllog.result(self.mllog, name, value, _metrics.get(name).unit)

    def evaluation(self, step: int | None = None, epoch: float | None = None,
                   metrics: dict[str, Any] | None = None,
                   wall_time: float | None = None, recorded: float | None = None) -> None:
        values = check_figures(metrics, self.workload_file)
        self.fields["evaluations"].append(
            {"step": step, "epoch": epoch,
             "wall_time": self.elapsed() if wall_time is None else wall_time,
             "metrics": values, "recorded": time.time() if recorded is None else recorded})

    def store_path(self, path: str | Path) -> str:
        return self.relay.store_path(path)

    def _keep_artifact(self, stored: str, digest: str, size: int) -> None:
        self.fields["artifacts"].append([stored, digest, size])

    def _store(self, status: str, figures: dict[str, float], details: dict[str, Any],
               error: str | None) -> None:
        """Hand the finished run's record to the relay (run_stop is in its buffered MLLOG)."""
        self.fields["figures"].update(figures)
        self.fields["details"].update(details)
        self.fields.update(status=status, error=error, stopped=time.time())
        self.relay.finished.append(self.fields)

    def _running(self, what: str) -> None:
        if self.status != "running":
            raise D500Error(f"the run is already {self.status}; cannot {what}")


def import_run(ledger: Ledger, record: dict[str, Any]) -> int:
    """Write a finished run a Relay recorded as one sealed ledger row (with its trial link,
    evaluations, MLLOG file and artifacts); returns its run id."""
    if not isinstance(record, dict) or record.get("relay") != FORMAT:
        raise D500Error(f"not a relay record of format {FORMAT}")
    missing = [k for k in KEYS if k not in record]
    if missing:
        raise D500Error(f"relay record lacks {', '.join(missing)}")
    if record["status"] not in FINAL:
        raise D500Error(f"relay record status '{record['status']}' is not a final status "
                        f"({', '.join(FINAL)})")
    where = record["workload_file"]
    figures = check_figures(record["figures"], where)
    evaluations = [(e["step"], e["epoch"], e["wall_time"],
                    dumps(check_figures(e["metrics"], where)), e["recorded"])
                   for e in record["evaluations"]]
    group, rank, world_size, parent = placement(record["group"], record["rank"],
                                                record["world_size"], record["parent"])
    proc = record["process"]
    with ledger._write() as db:
        for table, what, ref in (("runs", "parent run", parent),
                                 ("studies", "study", record["study"])):
            if ref is not None and not db.execute(f"SELECT 1 FROM {table} WHERE id = ?",
                                                  (ref,)).fetchone():
                raise D500Error(f"relay record names {what} {ref}, which the ledger "
                                f"{ledger.path} does not hold")
        run_id = insert_row(db, {
            "level": record["level"], "workload": record["workload"],
            "submission": record["submission"], "backend": record["backend"],
            "status": record["status"], "seed": record["seed"], "started": record["started"],
            "stopped": record["stopped"], "hyperparameters": dumps(record["hyperparameters"]),
            "figures": dumps(figures), "details": dumps(record["details"]),
            "error": record["error"], "env_id": environment_id(db, record["provenance"]),
            "pid": proc["pid"], "host": proc["host"], "boot_id": proc["boot_id"],
            "proc_start": proc["proc_start"], "workload_file": record["workload_file"],
            "workload_text": record["workload_text"],
            "workload_sha256": record["workload_sha256"], "model_file": record["model_file"],
            "model_sha256": record["model_sha256"],
            "submission_files": dumps(record["submission_files"]), "run_group": group,
            "rank": rank, "world_size": world_size, "parent_run": parent}, evaluations)
        link_trial(db, record["study"], record["trial"], run_id, record["hyperparameters"])
        log_path = ledger.root / "runs" / str(run_id) / "mllog.txt"
        _mllog.write_log(log_path, [{**r, "value": run_id} if r["key"] == "d500_run_id" else r
                                    for r in record["mllog"]])
        seal_with_log(ledger, db, run_id, record["artifacts"], log_path)
    return run_id


def insert_row(db: sqlite3.Connection, columns: dict[str, Any],
               evaluations: Sequence[Sequence[Any]]) -> int:
    """Insert a finished run recorded elsewhere ({runs column: value as stored}) and its
    evaluations ((step, epoch, wall_time, metrics text, recorded) each), inside the caller's
    write transaction; returns the new run id. Shared by relay records and package imports
    (d500.ledger.imports)."""
    names = list(columns)
    cur = db.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES "
                     f"({', '.join('?' * len(names))})", [columns[n] for n in names])
    run_id = int(cur.lastrowid)  # type: ignore[arg-type]
    db.executemany("INSERT INTO evaluations (run_id, step, epoch, wall_time, metrics,"
                   " recorded) VALUES (?,?,?,?,?,?)", [(run_id, *e) for e in evaluations])
    return run_id


def seal_with_log(ledger: Ledger, db: sqlite3.Connection, run_id: int,
                  artifacts: Sequence[Sequence[Any]], log_path: Path) -> None:
    """Store a row's artifacts ([path, sha256, bytes] each) and its MLLOG file, already written
    at `log_path`, as the last one; point the row at that log and seal it (in the caller's
    write transaction)."""
    now = time.time()
    arts = [*artifacts, [ledger.store_path(log_path), integrity.sha256_file(log_path),
                         log_path.stat().st_size]]
    db.executemany("INSERT INTO artifacts (run_id, path, sha256, bytes, recorded) "
                   "VALUES (?,?,?,?,?)", [(run_id, *a, now) for a in arts])
    db.execute("UPDATE runs SET mllog = ? WHERE id = ?", (ledger.store_path(log_path), run_id))
    integrity.seal(db, run_id)
