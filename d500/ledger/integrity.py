"""Tamper evidence: sealing a finished run into the hash chain, and verifying rows and files.

A finished row is sealed: the sha256 of each sealed field (its evaluations, artifacts, trial and
the digest of its provenance included) is stored in `runs.sealed`, and a row hash over that seal
is chained to the previous sealed row's hash. Verifying recomputes all of it and re-checks every
recorded file (workload, model, submission files, artifacts) against its sha256, through
FileDigests, which can reuse a file's digest while its size, mtime, ctime and inode are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
SEALED = ("level", "workload", "submission", "backend", "status", "seed", "started", "stopped",
          "hyperparameters", "figures", "details", "error", "env_id", "workload_file",
          "workload_text", "workload_sha256", "model_file", "model_sha256", "submission_files",
          "mllog", "pid", "host")
# Sealed only when not NULL. These columns came with schema 2; rows sealed before it have no
# hash for them and must still verify. Hashing a field only when it holds a value, and comparing
# the union of the recorded and the recomputed field names, keeps both kinds of row checkable:
# a value written into an old row (or a new row sealed without one) appears as a field the seal
# lacks, and a value removed from a row sealed with it as a field the row lacks; both are
# reported as changed. A single-process run (all NULL) seals exactly as before. The package
# link of a run imported from a package (schema 5: package_id, origin) is sealed the same way,
# so removing it (or its forced mark, which `origin` holds) is a change verify reports.
SEALED_IF_SET = ("run_group", "rank", "world_size", "parent_run", "package_id", "origin")
# A cached digest is reused only for a file last changed this long before it was hashed: a write
# within the file system's timestamp granularity after hashing would leave size, mtime and ctime
# as cached (git's "racy clean" problem), so such entries are re-hashed until they are older.
RACY_NS = 2_000_000_000


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Legacy:
    """The seal of a row sealed before the provenance digest was: it covers `env_id`."""


LEGACY = _Legacy()


def seal_fields(row: dict[str, Any], evaluations: list[Any], artifacts: list[Any],
                trial: list[Any] | None, environment: str | None | _Legacy = LEGACY
                ) -> dict[str, str]:
    """The sha256 of every sealed field of a run, from its values as the ledger stores them.

    `row` maps each column of SEALED and SEALED_IF_SET to its stored value (TEXT stays text,
    NULL is None; a missing key counts as NULL), `evaluations` holds [step, epoch, wall_time,
    metrics, recorded] per evaluation and `artifacts` [path, sha256, bytes] per artifact, both
    in insertion order, and `trial` is [study_id, number, params] or None. `environment` is the
    digest of the run's provenance (None: none recorded), sealed as the field `environment`
    in place of the local `env_id`, so that the provenance a row points to cannot be swapped
    without re-sealing; LEGACY seals `env_id` as rows sealed before did (see `is_legacy`).
    Pure: the database path (field_hashes) and a package reader (d500.competition.package)
    both call it.
    """
    legacy = isinstance(environment, _Legacy)
    names = [n for n in SEALED if legacy or n != "env_id"]
    names += [n for n in SEALED_IF_SET if row.get(n) is not None]
    fields = {name: sha(json.dumps(row.get(name))) for name in names}
    if not legacy:
        fields["environment"] = sha(json.dumps(environment))
    fields["evaluations"] = sha(json.dumps([list(e) for e in evaluations]))
    fields["artifacts"] = sha(json.dumps([list(a) for a in artifacts]))
    fields["trial"] = sha(json.dumps(None if trial is None else list(trial)))
    return fields


def sealed_record(db: sqlite3.Connection, run_id: int
                  ) -> tuple[dict[str, Any], list[list[Any]], list[list[Any]], list[Any] | None]:
    """(row, evaluations, artifacts, trial) of a run as the database holds them now: exactly
    the arguments of seal_fields."""
    names = (*SEALED, *SEALED_IF_SET)
    found = db.execute(f"SELECT {', '.join(names)} FROM runs WHERE id = ?", (run_id,)).fetchone()
    row = {name: found[i] for i, name in enumerate(names)}
    evals = db.execute("SELECT step, epoch, wall_time, metrics, recorded FROM evaluations "
                       "WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
    arts = db.execute("SELECT path, sha256, bytes FROM artifacts WHERE run_id = ? ORDER BY id",
                      (run_id,)).fetchall()
    trial = db.execute("SELECT study_id, number, params FROM trials WHERE run_id = ?",
                       (run_id,)).fetchone()
    return (row, [list(e) for e in evals], [list(a) for a in arts],
            None if trial is None else list(trial))


def is_legacy(recorded: dict[str, Any]) -> bool:
    """Whether a recorded seal is of the old kind, over `env_id` and not the provenance digest
    (rows sealed by d500 before it sealed the digest: they still verify, as they were)."""
    return "env_id" in recorded and "environment" not in recorded


def environment_digest(db: sqlite3.Connection, run_id: int) -> str | None:
    """The digest of the provenance a run's env_id points to now (None: none)."""
    found = db.execute("SELECT e.digest FROM runs r JOIN environments e ON e.id = r.env_id "
                       "WHERE r.id = ?", (run_id,)).fetchone()
    return None if found is None else str(found[0])


def field_hashes(db: sqlite3.Connection, run_id: int, legacy: bool = False) -> dict[str, str]:
    """The sha256 of every sealed field of a run as the database holds it now (`legacy`: as an
    old seal covered them, env_id and not the provenance digest)."""
    return seal_fields(*sealed_record(db, run_id),
                       LEGACY if legacy else environment_digest(db, run_id))


def row_hash(prev_hash: str, run_id: int, sealed: str) -> str:
    return sha(f"{prev_hash}|{run_id}|{sealed}")


def seal(db: sqlite3.Connection, run_id: int) -> None:
    """Seal a finished row and append it to the chain (inside the caller's write transaction)."""
    sealed = json.dumps(field_hashes(db, run_id), sort_keys=True)
    last = db.execute("SELECT chain_seq, row_hash FROM runs WHERE chain_seq IS NOT NULL "
                      "ORDER BY chain_seq DESC LIMIT 1").fetchone()
    seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
    digest = row_hash(prev, run_id, sealed)
    db.execute("UPDATE runs SET chain_seq = ?, sealed = ?, prev_hash = ?, row_hash = ? "
               "WHERE id = ?", (seq, sealed, prev, digest, run_id))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('chain_head', ?)", (f"{seq} {digest}",))


class FileDigests:
    """sha256 of files during one verification: each file hashed at most once, and with
    `rehash=False` not at all while its cached (size, mtime_ns, ctime_ns, inode) still match.

    The cache is the ledger's `file_digests` table. It is not sealed: whoever can write the
    database could plant a digest, so it only spares the leaderboard's renders; `d500 ledger
    verify` (rehash=True) hashes every file again and refreshes the cache.
    """

    def __init__(self, db: sqlite3.Connection, rehash: bool):
        self.db, self.rehash = db, rehash
        self.pending: list[tuple[str, int, int, int, int, str, int]] = []
        self._memo: dict[Path, str | None] = {}

    def __call__(self, path: Path) -> str | None:
        """The file's sha256, None if it is missing."""
        if path not in self._memo:
            self._memo[path] = self._digest(path)
        return self._memo[path]

    def _digest(self, path: Path) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if not self.rehash:
            row = self.db.execute("SELECT size, mtime_ns, ctime_ns, inode, sha256, hashed_ns "
                                  "FROM file_digests WHERE path = ?", (str(path),)).fetchone()
            if (row is not None and tuple(row[:4]) == key
                    and max(key[1], key[2]) < row[5] - RACY_NS):
                return str(row[4])
        hashed_ns = time.time_ns()
        digest = sha256_file(path)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino) == key:
            self.pending.append((str(path), *key, digest, hashed_ns))
        return digest

    def store(self, db: sqlite3.Connection) -> None:
        """Remember the digests computed (in the caller's write transaction)."""
        db.executemany("INSERT OR REPLACE INTO file_digests (path, size, mtime_ns, ctime_ns,"
                       " inode, sha256, hashed_ns) VALUES (?,?,?,?,?,?,?)", self.pending)
        self.pending = []


@dataclass(frozen=True)
class FileFinding:
    """A file outside the ledger (a run's workload, model or submission file) that is missing
    or differs from the sha256 a run recorded: a finding about the file, not about the row."""

    run: int
    what: str  # "workload file", "model file" or "submission file"
    path: Path
    recorded: str
    now: str | None  # None: missing
    line: str  # the run's problem line that says it (in verify_snapshot's per_run)


def verify_snapshot(db: sqlite3.Connection, resolve: Callable[[str], Path],
                    digests: FileDigests, files: list[FileFinding] | None = None
                    ) -> tuple[dict[int, list[str]], list[str]]:
    """({run id: problems}, [problems not tied to one run]) of the state `db` shows; `files`,
    when given, also gets each problem about a run's workload, model or submission file."""
    per_run: dict[int, list[str]] = {}
    general: list[str] = []

    def file_changed(stored: str, recorded: str, what: str) -> tuple[str | None, Path,
                                                                       str | None]:
        path = resolve(stored)
        now = digests(path)
        if now is None:
            return f"{what} {path} is missing", path, now
        if now != recorded:
            return (f"{what} {path} changed since it was recorded "
                    f"(sha256 {recorded[:12]}… now {now[:12]}…)"), path, now
        return None, path, now

    for env in db.execute("SELECT id, digest, provenance FROM environments"):
        if sha(env[2]) != env[1]:
            general.append(f"environment {env[0]}: provenance changed since it was recorded")
    prev_hash, expected_seq = GENESIS, 1
    rows = db.execute("SELECT id, status, chain_seq, sealed, prev_hash, row_hash, workload_file,"
                      " workload_sha256, model_file, model_sha256, submission_files FROM runs"
                      " ORDER BY chain_seq IS NULL, chain_seq, id").fetchall()
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
        if row_hash(r["prev_hash"], rid, r["sealed"] or "") != r["row_hash"]:
            problems.append(f"run {rid}: row hash does not match (its seal was edited)")
        current = field_hashes(db, rid, is_legacy(recorded))
        changed = [k for k in (*current, *(k for k in recorded if k not in current))
                   if recorded.get(k) != current.get(k)]
        if changed:
            problems.append(f"run {rid}: {', '.join(changed)} changed in the database "
                            "since the run was recorded")
        prev_hash = r["row_hash"]
        checks = [(r["workload_file"], r["workload_sha256"], "workload file"),
                  (r["model_file"], r["model_sha256"], "model file")]
        checks += [(p, h, "submission file")
                   for p, h in json.loads(r["submission_files"] or "{}").items()]
        checks += [(a[0], a[1], "artifact") for a in db.execute(
            "SELECT path, sha256 FROM artifacts WHERE run_id = ? ORDER BY id", (rid,))]
        for stored, digest, what in checks:
            if stored and digest:
                found, path, now = file_changed(stored, digest, what)
                if found:
                    problems.append(f"run {rid}: {found}")
                    if files is not None and what != "artifact":
                        files.append(FileFinding(rid, what, path, digest, now, problems[-1]))
    head = db.execute("SELECT value FROM meta WHERE key = 'chain_head'").fetchone()
    if head is not None:
        head_seq, head_hash = head[0].split()
        if int(head_seq) >= expected_seq:
            general.append(f"chain: the last sealed rows {expected_seq}..{head_seq} are "
                           "missing (deleted from the database?)")
        elif int(head_seq) == expected_seq - 1 and head_hash != prev_hash:
            general.append("chain: the last sealed row does not match the recorded chain head")
    return per_run, general
