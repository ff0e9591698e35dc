"""Verifying runs imported from packages (d500.ledger.imports) against the chain they came from.

Each imported run's sealed link (runs.origin) names the sha256 of its package, of the package's
manifest, of its exported record, of the problems it was imported with and its forced mark; the
record itself (kept in `origins`) holds what the origin ledger hashed. Verification recomputes
the origin's seal and row hash from that record, finds them in the package's chain skeleton,
checks the record against the manifest and the link, and the row here against the record, so
an edit to the imported row, to the stored record or to the packages row is each named.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from d500.competition.layout import CHAIN, run_member
from d500.ledger import integrity

# Columns an imported row copies unchanged from its origin row (d500.ledger.imports); the
# others are this ledger's own (env_id, file paths, group, parent, package link).
COPIED = ("level", "workload", "submission", "backend", "status", "seed", "started", "stopped",
          "hyperparameters", "figures", "details", "error", "workload_text", "workload_sha256",
          "model_sha256", "pid", "host", "rank", "world_size")


def verify(db: sqlite3.Connection, per_run: dict[int, list[str]], general: list[str]) -> None:
    """Add to `per_run` and `general` (integrity.verify_snapshot's) what is wrong with the
    imported runs and their packages in the state `db` shows."""
    packages = {r["id"]: _Package(r, general) for r in db.execute("SELECT * FROM packages")}
    origins = {r["run_id"]: r for r in db.execute("SELECT * FROM origins")}
    rows = db.execute("SELECT r.*, e.digest AS env_digest FROM runs r LEFT JOIN environments e"
                      " ON e.id = r.env_id WHERE r.package_id IS NOT NULL OR r.origin IS NOT"
                      " NULL OR r.id IN (SELECT run_id FROM origins) ORDER BY r.id")
    for row in rows.fetchall():
        rid = row["id"]
        origin = origins.get(rid)
        problems = per_run.setdefault(rid, [])
        if origin is None:
            problems.append(f"run {rid}: imported from a package but its origin record is "
                            "gone (deleted from the database?)")
            continue
        pkg = packages.get(origin["package_id"])
        if pkg is None:
            problems.append(f"run {rid}: its package {origin['package_id']} is gone "
                            "(deleted from the database?)")
            continue
        what = f"run {rid} (origin run {origin['origin_id']} of package {pkg.sha12})"
        problems += [f"{what}: {p}" for p in _run(row, origin, pkg)]
    for pkg in packages.values():
        general += [f"package {pkg.sha12}: {p}" for p in sorted(pkg.changed)]
    for rid in sorted(origins.keys() - per_run.keys()):
        general.append(f"origin record of run {rid}: the run is gone (deleted?)")


class _Package:
    """A packages row, parsed once: its manifest and chain skeleton."""

    def __init__(self, row: sqlite3.Row, general: list[str]):
        self.row, self.sha12 = row, str(row["sha256"])[:12]
        self.changed: set[str] = set()  # its row against its runs' sealed links
        self.manifest_sha = integrity.sha(row["manifest"])
        try:
            self.members: dict[str, str] = json.loads(row["manifest"])["members"]
        except (ValueError, KeyError, TypeError):
            self.members = {}
            general.append(f"package {self.sha12}: its stored manifest is not a package "
                           "manifest (edited in the database?)")
        self.chain: dict[int, list[Any]] = {}
        chain_sha = self.members.get(CHAIN)
        if chain_sha is not None and integrity.sha(row["chain"]) != chain_sha:
            general.append(f"package {self.sha12}: its stored chain.json does not match the "
                           "manifest's sha256 (edited in the database?)")
        try:
            self.chain = {int(c[0]): list(c) for c in json.loads(row["chain"])}
        except (ValueError, TypeError, IndexError):
            general.append(f"package {self.sha12}: its stored chain.json is not a chain")


def _run(row: sqlite3.Row, origin: sqlite3.Row, pkg: _Package) -> list[str]:
    """What is wrong with one imported row, its origin record and its link to the package."""
    found: list[str] = []
    try:
        link = json.loads(row["origin"] or "{}")
    except ValueError:
        link = {}
    if not isinstance(link, dict) or not link:
        return ["its sealed package link (runs.origin) is gone"]
    expected = {"package": pkg.row["sha256"], "run": origin["origin_id"],
                "record": integrity.sha(origin["record"])}
    why = {"package": "the package it names is not the one stored",
           "run": "its origin run id changed since import",
           "record": "its stored origin record changed since import"}
    found += [why[k] for k in expected if link.get(k) != expected[k]]
    for key, now, what in (
            ("manifest", pkg.manifest_sha, "its stored manifest changed since import"),
            ("entry", pkg.row["entry"], "its entry name changed since import"),
            ("signer", pkg.row["signer"], "its signer changed since import"),
            ("imported", pkg.row["imported"], "its import time changed since import"),
            ("forced", bool(pkg.row["forced"]), ("its forced mark changed since import (its "
             f"runs were sealed {'forced' if link.get('forced') else 'not forced'})")),
            ("problems", integrity.sha(pkg.row["problems"]),
             "its recorded problems changed since import")):
        if link.get(key) != now:
            pkg.changed.add(what)
    if row["package_id"] != origin["package_id"]:
        found.append("its package link does not match its origin record")
    member = pkg.members.get(run_member(origin["origin_id"]))
    if member != integrity.sha(origin["record"]):
        found.append("its origin record is not the one the package manifest lists")
    try:
        record = json.loads(origin["record"])
        sealed = json.loads(origin["sealed"])
        seal = integrity.seal_fields(
            record["row"], record["evaluations"], record["artifacts"], record["trial"],
            integrity.LEGACY if integrity.is_legacy(sealed) else record.get("environment"))
    except (ValueError, KeyError, TypeError):
        return [*found, "its origin record cannot be read (edited in the database?)"]
    stored = (origin["chain_seq"], origin["prev_hash"], origin["sealed"], origin["row_hash"])
    if stored != (record.get("chain_seq"), record.get("prev_hash"), record.get("sealed"),
                  record.get("row_hash")):
        found.append("its origin chain position, seal or row hash differ from its record")
    changed = sorted(k for k in {*seal, *sealed} if seal.get(k) != sealed.get(k))
    if changed:
        found.append(f"{', '.join(changed)} of its origin record do not match the origin's "
                     "seal")
    if integrity.row_hash(origin["prev_hash"], origin["origin_id"],
                          origin["sealed"]) != origin["row_hash"]:
        found.append("its origin row hash does not match its origin seal")
    link_in_chain = pkg.chain.get(origin["chain_seq"])
    if link_in_chain != [origin["chain_seq"], origin["origin_id"], origin["prev_hash"],
                         origin["row_hash"]]:
        found.append(f"its origin row hash is not at position {origin['chain_seq']} of the "
                     "package's chain")
    differ = [k for k in COPIED if row[k] != record["row"].get(k)]
    if row["env_digest"] != record.get("environment"):
        differ.append("provenance")
    if differ:
        found.append(f"{', '.join(differ)} differ from the origin record")
    return found
