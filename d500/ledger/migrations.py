"""The ledger's schema as numbered migrations, applied in order in one transaction on open.

A ledger records its version in `meta.schema_version` (schema 1, written before migrations
existed, set it there too). Opening a ledger applies every migration numbered above its version,
inside one IMMEDIATE transaction (SQLite DDL is transactional: a failure leaves the file as it
was), so a ledger written by an older d500 is upgraded in place. A ledger of a newer version than
this code knows is refused with a D500Error instead of being written with an old idea of its
tables. Add a migration by appending (number, what it does, SQL or function); never edit one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from d500.errors import D500Error

Step = str | Callable[[sqlite3.Connection], None]

# 1: the tables of the first ledger (d500 before migrations), exactly as it created them.
V1 = """
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

# 2: what levels 2 and 3 need on a run: the group it belongs to (the N ranks of one distributed
# run, a multi-seed series), its rank among world_size processes (NULL for one process), and
# the run it derives from (a fine-tuning, a resumed or re-evaluated run).
V2 = """
ALTER TABLE runs ADD COLUMN run_group TEXT;
ALTER TABLE runs ADD COLUMN rank INTEGER;
ALTER TABLE runs ADD COLUMN world_size INTEGER;
ALTER TABLE runs ADD COLUMN parent_run INTEGER REFERENCES runs(id);
CREATE INDEX runs_by_group ON runs (run_group);
"""

# 3: the digest cache of Ledger.verify_runs: a file's sha256 as last hashed, with the stat
# fields that must all be unchanged for it to be reused (see integrity.FileDigests).
V3 = """
CREATE TABLE file_digests (
    path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL, inode INTEGER NOT NULL, sha256 TEXT NOT NULL,
    hashed_ns INTEGER NOT NULL);
"""

# 4: a tuning trial may be attempted again (a resumed tuning re-runs the trial a killed process
# left interrupted; the interrupted run stays): UNIQUE (study_id, number) becomes
# UNIQUE (study_id, number, attempt). SQLite cannot drop a constraint, so the table is rebuilt.
V4 = """
CREATE TABLE trials_v4 (
    id INTEGER PRIMARY KEY, study_id INTEGER NOT NULL REFERENCES studies(id),
    number INTEGER NOT NULL, run_id INTEGER UNIQUE NOT NULL REFERENCES runs(id),
    params TEXT, attempt INTEGER NOT NULL DEFAULT 0, UNIQUE (study_id, number, attempt));
INSERT INTO trials_v4 (id, study_id, number, run_id, params, attempt)
    SELECT id, study_id, number, run_id, params, 0 FROM trials;
DROP TABLE trials;
ALTER TABLE trials_v4 RENAME TO trials;
CREATE INDEX studies_by_name ON studies (name);
"""

# 5: runs imported from a competitor's package (d500 ledger import, d500.ledger.imports): the
# package itself (its manifest, chain skeleton, signer, whether it was forced in past `d500
# check` and the problems it had), and per imported run its origin: the origin ledger's run id,
# chain position, seal and row hash, and the exported record they were computed from. An
# imported run is an ordinary sealed row of this ledger whose package_id and `origin` (the
# hashes that tie it to its package) are sealed with it; a study recreated from a package
# points to it too.
V5 = """
CREATE TABLE packages (
    id INTEGER PRIMARY KEY, sha256 TEXT UNIQUE NOT NULL, entry TEXT NOT NULL,
    manifest TEXT NOT NULL, signer TEXT, imported REAL NOT NULL,
    forced INTEGER NOT NULL DEFAULT 0, problems TEXT NOT NULL DEFAULT '[]',
    chain TEXT NOT NULL DEFAULT '[]');
CREATE TABLE origins (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id),
    package_id INTEGER NOT NULL REFERENCES packages(id), origin_id INTEGER NOT NULL,
    chain_seq INTEGER NOT NULL, prev_hash TEXT NOT NULL, sealed TEXT NOT NULL,
    row_hash TEXT NOT NULL, record TEXT NOT NULL, UNIQUE (package_id, origin_id));
ALTER TABLE runs ADD COLUMN package_id INTEGER REFERENCES packages(id);
ALTER TABLE runs ADD COLUMN origin TEXT;
ALTER TABLE studies ADD COLUMN package_id INTEGER REFERENCES packages(id);
CREATE INDEX runs_by_package ON runs (package_id);
"""

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the first ledger: runs, studies, trials, evaluations, artifacts, environments", V1),
    (2, "runs: run_group, rank, world_size, parent_run (levels 2 and 3)", V2),
    (3, "file_digests: cached file hashes for verify_runs", V3),
    (4, "trials: attempts of a trial number (resumed tuning)", V4),
    (5, "packages and origins: runs imported from competitors' packages", V5),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def version(db: sqlite3.Connection) -> int:
    """The schema version of an open ledger: 0 for an empty file."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
                      ).fetchone():
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else 0
    except ValueError:
        raise D500Error(f"meta.schema_version is {row[0]!r}, not a number") from None


def refuse_foreign(db: sqlite3.Connection, path: Path) -> None:
    """A D500Error where the database at `path` holds tables but no d500 ledger's (`meta`):
    said before d500 changes anything in it (its journal mode: WAL, kept in the file)."""
    if version(db) == 0 and db.execute("SELECT 1 FROM sqlite_master").fetchone():
        raise D500Error(f"{path}: an SQLite database but not a d500 ledger (it has tables "
                        "but no meta.schema_version)")


def upgrade(db: sqlite3.Connection, path: Path) -> int:
    """Bring an open ledger (autocommit connection) to SCHEMA_VERSION; return that version."""
    current = _checked(db, path)
    if current == SCHEMA_VERSION:
        return current
    db.execute("BEGIN IMMEDIATE")
    try:
        current = _checked(db, path)  # another process may have upgraded it meanwhile
        if current == 0:
            refuse_foreign(db, path)
        for number, _, step in MIGRATIONS:
            if number > current:
                _apply(db, step)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                           (str(number),))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return SCHEMA_VERSION


def _checked(db: sqlite3.Connection, path: Path) -> int:
    try:
        current = version(db)
    except D500Error as err:
        raise D500Error(f"{path}: {err}") from None
    if current > SCHEMA_VERSION:
        raise D500Error(f"{path}: ledger schema version {current} is newer than this d500 "
                        f"understands ({SCHEMA_VERSION}); open it with a newer d500")
    return current


def _apply(db: sqlite3.Connection, step: Step) -> None:
    if callable(step):
        step(db)
        return
    for statement in step.split(";"):  # not executescript: it would COMMIT first
        if statement.strip():
            db.execute(statement)
