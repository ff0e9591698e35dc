"""The Ledger object callers hold: reading runs, studies and environments here; writing delegated
to start and lifecycle, liveness checks to liveness, sealing and verification to integrity."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from d500.errors import UsageError
from d500.ledger import integrity, lifecycle, origins
from d500.ledger.lifecycle import STATUSES, Run, Study, iso
from d500.ledger.liveness import process_alive
from d500.ledger.start import RunFields, RunStarter
from d500.ledger.store import Store, loads, locked

# An imported run's `source`: the latest package of its entry (and forced mark) that brought
# runs, under which boards show all of them as one row, and how many such packages there are.
_SOURCES = ("packages p2 WHERE p2.entry = p.entry AND p2.forced = p.forced AND EXISTS "
            "(SELECT 1 FROM runs r2 WHERE r2.package_id = p2.id)")
RUN_SELECT = ("SELECT r.*, t.study_id AS study, t.number AS trial, "
              "(SELECT name FROM studies WHERE id = t.study_id) AS study_name, "
              "p.entry AS package_entry, "
              "p.sha256 AS package_sha256, p.forced AS package_forced, s.id AS source_id, "
              f"s.sha256 AS source_sha256, (SELECT COUNT(*) FROM {_SOURCES}) AS source_count "
              "FROM runs r LEFT JOIN trials t ON t.run_id = r.id "
              "LEFT JOIN packages p ON p.id = r.package_id "
              f"LEFT JOIN packages s ON s.id = (SELECT MAX(p2.id) FROM {_SOURCES})")


class Ledger(Store, RunStarter[Run]):
    """One SQLite file of runs; safe to use from several processes at once."""

    # ------------------------------------------------------------ writing (start_run: RunStarter)
    def _open_run(self, fields: RunFields, study: Study | int | None,
                  trial: int | None) -> Run:
        return lifecycle.insert_run(self, fields, study, trial)

    def start_study(self, name: str, level: int | None, workload: str, submission: str,
                    backend: str | None, objective: str,
                    search_space: dict[str, Any] | None = None,
                    budget: dict[str, Any] | None = None) -> Study:
        """A tuning study: its trials are runs started with `study.trial(params, ...)`."""
        return lifecycle.start_study(self, name, level, workload, submission, backend,
                                     objective, search_space, budget)

    def open_study(self, name: str, level: int | None, workload: str, submission: str,
                   backend: str | None, objective: str,
                   search_space: dict[str, Any] | None = None,
                   budget: dict[str, Any] | None = None) -> Study:
        """The study `name` of this entry, reopened to resume it, or a new one."""
        return lifecycle.open_study(self, name, level, workload, submission, backend,
                                    objective, search_space, budget)

    def import_run(self, record: dict[str, Any]) -> int:
        """Write a finished run that a Relay recorded in another process (an MPI rank that
        cannot reach this ledger) as a sealed row: its own times, host, provenance, MLLOG,
        evaluations and trial link. Returns the new run id."""
        from d500.ledger.relay import import_run
        return import_run(self, record)

    def import_package(self, package: str | Path | Any, *, force: bool = False,
                       rules_dir: str | Path | None = None) -> Any:
        """Merge a competitor's package (a path or an open d500.competition.package.Package):
        checked, refused when it fails unless `force`, a no-op the second time. Returns a
        d500.ledger.imports.Imported."""
        from d500.ledger.imports import import_package
        return import_package(self, package, force=force, rules_dir=rules_dir)

    def reap(self) -> list[int]:
        """Seal as `interrupted` every running row (and study) of this host whose process died;
        the ids of the runs sealed."""
        return lifecycle.reap(self)

    # ------------------------------------------------------------ reading
    @locked
    def runs(self, level: int | None = None, workload: str | None = None,
             status: str | None = None, submission: str | None = None,
             backend: str | None = None, group: str | int | None = None
             ) -> list[dict[str, Any]]:
        """Runs, oldest first; `status` filters on the status every reader shows."""
        if status is not None and status not in STATUSES:
            raise UsageError(f"unknown status '{status}' (choose from {', '.join(STATUSES)})")
        where, args = [], []
        for col, val in (("level", level), ("workload", workload), ("submission", submission),
                         ("backend", backend),
                         ("run_group", None if group is None else str(group))):
            if val is not None:
                where.append(f"r.{col} = ?")
                args.append(val)
        sql = RUN_SELECT + (" WHERE " + " AND ".join(where) if where else "")
        rows = [self._run_dict(r) for r in self._db.execute(sql + " ORDER BY r.id", args)]
        return [r for r in rows if status is None or r["status"] == status]

    @locked
    def get(self, run_id: int | str) -> dict[str, Any]:
        """One run with its evaluations, artifacts and provenance; unknown ids are a UsageError."""
        try:
            rid = int(run_id)
        except (TypeError, ValueError):
            raise UsageError(f"run id must be a number, got '{run_id}'") from None
        row = self._db.execute(RUN_SELECT + " WHERE r.id = ?", (rid,)).fetchone()
        if row is None:
            raise UsageError(f"no run {rid} in the ledger {self.path}")
        run = self._run_dict(row)
        run["evaluations"] = self.evaluations(rid)
        run["artifacts"] = self.artifacts(rid)
        run["provenance"] = self.environment(run["environment"])
        origin = self._db.execute("SELECT package_id, origin_id, chain_seq, row_hash FROM "
                                  "origins WHERE run_id = ?", (rid,)).fetchone()
        run["origin"] = None if origin is None else {
            "package": origin[0], "run": origin[1], "chain_seq": origin[2],
            "row_hash": origin[3]}
        return run

    @locked
    def packages(self) -> list[dict[str, Any]]:
        """The packages imported (d500 ledger import), oldest first, with their run counts."""
        return [{"id": r["id"], "sha256": r["sha256"], "entry": r["entry"],
                 "signer": r["signer"], "imported": iso(r["imported"]),
                 "forced": bool(r["forced"]), "problems": loads(r["problems"]),
                 "runs": r["runs"]}
                for r in self._db.execute(
                    "SELECT p.*, (SELECT COUNT(*) FROM origins o WHERE o.package_id = p.id) "
                    "AS runs FROM packages p ORDER BY p.id")]

    @locked
    def runs_by_id(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        marks = ",".join("?" * len(ids))
        return [self._run_dict(r) for r in self._db.execute(
            f"{RUN_SELECT} WHERE r.id IN ({marks}) ORDER BY r.id", list(ids))]

    @locked
    def evaluations(self, run_id: int) -> list[dict[str, Any]]:
        return [{"step": r["step"], "epoch": r["epoch"], "wall_time": r["wall_time"],
                 "metrics": loads(r["metrics"]), "recorded": iso(r["recorded"])}
                for r in self._db.execute("SELECT * FROM evaluations WHERE run_id = ? "
                                          "ORDER BY id", (run_id,))]

    @locked
    def artifacts(self, run_id: int) -> list[dict[str, Any]]:
        return [{"path": r["path"], "sha256": r["sha256"], "bytes": r["bytes"],
                 "file": str(self.resolve_path(r["path"]))}
                for r in self._db.execute("SELECT * FROM artifacts WHERE run_id = ? "
                                          "ORDER BY id", (run_id,))]

    @locked
    def environment(self, env_id: int | None) -> dict[str, Any] | None:
        if env_id is None:
            return None
        row = self._db.execute("SELECT provenance FROM environments WHERE id = ?",
                               (env_id,)).fetchone()
        return None if row is None else loads(row[0])

    @locked
    def environments(self) -> dict[int, dict[str, Any]]:
        return {r[0]: loads(r[1]) for r in self._db.execute(
            "SELECT id, provenance FROM environments ORDER BY id")}

    @locked
    def studies(self) -> list[dict[str, Any]]:
        out = []
        for r in self._db.execute("SELECT * FROM studies ORDER BY id"):
            d = dict(r)
            for key in ("search_space", "budget", "details"):
                d[key] = loads(d[key])
            if d["status"] == "running" and process_alive(
                    d["pid"], d["host"], d["boot_id"], d["proc_start"]) is False:
                d["status"] = "interrupted"
            d["started"], d["stopped"] = iso(d["started"]), iso(d["stopped"])
            out.append(d)
        return out

    @locked
    def trials(self, study_id: int) -> list[dict[str, Any]]:
        out = []
        for t in self._db.execute("SELECT * FROM trials WHERE study_id = ? "
                                  "ORDER BY number, attempt",
                                  (study_id,)).fetchall():
            run = self.runs_by_id([t["run_id"]])[0]
            out.append({"number": t["number"], "attempt": t["attempt"],
                        "params": loads(t["params"]), "run": run})
        return out

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
            "hyperparameters": loads(r["hyperparameters"]) or {},
            "figures": loads(r["figures"]) or {}, "details": loads(r["details"]) or {},
            "error": r["error"], "environment": r["env_id"], "study": r["study"],
            "trial": r["trial"], "study_number": lifecycle.study_number(r["study_name"]),
            "group": r["run_group"], "rank": r["rank"],
            "world_size": r["world_size"], "parent": r["parent_run"],
            "pid": r["pid"], "host": r["host"],
            "workload_file": r["workload_file"], "workload_text": r["workload_text"],
            "workload_sha256": r["workload_sha256"], "model_file": r["model_file"],
            "model_sha256": r["model_sha256"],
            "submission_files": loads(r["submission_files"]) or {}, "mllog": r["mllog"],
            "sealed": r["row_hash"] is not None,
            "package": None if r["package_id"] is None else {
                "id": r["package_id"], "entry": r["package_entry"],
                "sha256": r["package_sha256"], "forced": bool(r["package_forced"])},
            "source": None if r["package_id"] is None else {
                "id": r["source_id"], "entry": r["package_entry"], "sha256": r["source_sha256"],
                "forced": bool(r["package_forced"]), "packages": r["source_count"]},
        }

    # ------------------------------------------------------------ integrity
    def verify(self, *, rehash: bool = True) -> list[str]:
        """Every problem found (empty when intact): changed rows, a broken chain, changed or
        missing files. By default every recorded file is hashed again, as `d500 ledger verify`
        does; rehash=False trusts the digest cache for files whose stat is unchanged."""
        per_run, general = self.verify_runs(rehash=rehash)
        return general + [p for run_id in sorted(per_run) for p in per_run[run_id]]

    @locked
    def verify_runs(self, *, rehash: bool = False, files: list[Any] | None = None
                    ) -> tuple[dict[int, list[str]], list[str]]:
        """({run id: problems} for every run, [problems not tied to one run]), read from one
        consistent snapshot while other processes keep writing. `files`, when given, also gets
        an integrity.FileFinding for each problem about a run's workload, model or submission
        file (a file outside the ledger that changed or went missing since, not the row).

        For displays rendered often (the leaderboard, `ledger show`), a file whose size, mtime,
        ctime and inode match the cache is not hashed again (rehash=False, the default);
        rehash=True hashes every file. The digests computed are cached for the next call."""
        with self._snapshot() as db:
            digests = integrity.FileDigests(db, rehash)
            found = integrity.verify_snapshot(db, self.resolve_path, digests, files)
            origins.verify(db, *found)
        if digests.pending:
            try:
                with self._write() as db:
                    digests.store(db)
            except sqlite3.OperationalError:
                pass  # a ledger this process may not write (read-only file): no cache, no harm
        return found
