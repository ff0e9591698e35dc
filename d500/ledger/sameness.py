"""A run's identity by content, not by chain position: its origin seal, its MLLOG's sha256, and
its run_start with its seed, so that a run already held is never imported again from any package.

    keys = run_keys(seal, log_bytes, workload, rank)   # what names the run, whatever its id
    held = Held.read(db, resolve, seeds)                # the same keys of every run held here
    held.find(keys)                                     # (run id, package sha256 | None, why)

A replay (another entry's runs renamed and re-sealed) changes the seal but keeps the MLLOG, or at
least its run_start and seed; a package rebuilt or grown by a run keeps the seals.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500 import mllog

WHY = {"seal": "the same origin seal", "log": "the same MLLOG (sha256)",
       "start": "the same run_start and seed in its MLLOG"}


def log_start(log: bytes) -> tuple[float, Any] | None:
    """(run_start's time_ms, the logged seed) of an MLLOG, None when it lacks either."""
    records, _ = mllog.parse_text(log.decode("utf-8", errors="replace"))
    start = next((r["time_ms"] for r in records if r["key"] == mllog.RUN_START), None)
    seed = next((r["value"] for r in records if r["key"] == mllog.SEED), None)
    if start is None or seed is None:
        return None
    return float(start), json.dumps(seed)


def run_keys(seal: str | None, log: bytes | None, workload: Any, rank: Any
             ) -> dict[str, Any]:
    """{kind: key} naming a run by its content (kinds of WHY; a kind it lacks is left out)."""
    keys: dict[str, Any] = {}
    if seal:
        keys["seal"] = seal
    if log is not None:
        keys["log"] = hashlib.sha256(log).hexdigest()
        start = log_start(log)
        if start is not None:
            keys["start"] = (str(workload), json.dumps(rank), *start)
    return keys


@dataclass
class Held:
    """The content keys of the runs a ledger holds: {(kind, key): (run id, package sha256)}."""

    keys: dict[tuple[str, Any], tuple[int, str | None]] = field(default_factory=dict)

    @classmethod
    def read(cls, db: sqlite3.Connection, resolve: Callable[[str], Path],
             seeds: Iterable[Any]) -> Held:
        """Every sealed run's seals (its own and its origin's) and MLLOG sha256, and the
        run_start of the held runs whose seed is one of `seeds` (only those logs are read)."""
        held = cls()
        package = {r[0]: r[1] for r in db.execute(
            "SELECT r.id, p.sha256 FROM runs r JOIN packages p ON p.id = r.package_id")}

        def add(kind: str, key: Any, run_id: int) -> None:
            held.keys.setdefault((kind, key), (run_id, package.get(run_id)))

        for run_id, sealed in db.execute("SELECT id, sealed FROM runs WHERE sealed IS NOT NULL"):
            add("seal", sealed, run_id)
        for run_id, sealed in db.execute("SELECT run_id, sealed FROM origins"):
            add("seal", sealed, run_id)
        for run_id, digest in db.execute("SELECT r.id, a.sha256 FROM runs r JOIN artifacts a "
                                         "ON a.run_id = r.id AND a.path = r.mllog"):
            add("log", digest, run_id)
        wanted = [s for s in set(seeds) if s is not None]
        if wanted:
            marks = ",".join("?" * len(wanted))
            for run_id, path, workload, rank in db.execute(
                    f"SELECT id, mllog, workload, rank FROM runs WHERE mllog IS NOT NULL AND "
                    f"seed IN ({marks})", wanted).fetchall():
                try:
                    log = resolve(path).read_bytes()
                except OSError:
                    continue
                keys = run_keys(None, log, workload, rank)
                if "start" in keys:
                    add("start", keys["start"], run_id)
        return held

    def find(self, keys: dict[str, Any]) -> tuple[int, str | None, str] | None:
        """(run id, its package's sha256 or None, why) of the held run with any of `keys`."""
        for kind in WHY:
            if kind in keys and (kind, keys[kind]) in self.keys:
                run_id, sha = self.keys[kind, keys[kind]]
                return run_id, sha, WHY[kind]
        return None

    def add(self, keys: dict[str, Any], run_id: int, sha: str | None) -> None:
        for kind, key in keys.items():
            self.keys.setdefault((kind, key), (run_id, sha))
