"""The ledger's SQLite file: one connection in WAL mode, short write transactions, consistent read
snapshots, the schema brought up to date on open, and how file paths are stored."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar

from d500.errors import D500Error, UsageError
from d500.ledger import migrations
from d500.paths import PROJECT_ROOT, home, home_named, looked_in

T = TypeVar("T")
HOME_PREFIX = "$D500_HOME/"
OPEN_PATIENCE = 120.0  # seconds a busy ledger may take to open


def dumps(value: Any) -> str:
    """Canonical JSON (sorted keys) of a value; NumPy scalars/arrays and paths included."""
    return json.dumps(value, sort_keys=True, default=_default)


def _default(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def locked(method: Callable[..., T]) -> Callable[..., T]:
    """Serialise a method on the ledger's connection across threads (reads included)."""
    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


def stored_path(path: str | Path, root: Path) -> str:
    """How a ledger whose folder is `root` stores a path: relative to that folder or to the
    project when inside them (so another checkout or home resolves it), else absolute."""
    p = Path(path).resolve()
    if p.is_relative_to(root):
        return HOME_PREFIX + p.relative_to(root).as_posix()
    if p.is_relative_to(PROJECT_ROOT):
        return p.relative_to(PROJECT_ROOT).as_posix()
    return str(p)


def absent(path: str | Path | None = None) -> str:
    """Why there is no ledger to read at `path` (given by `--ledger`) or, where None, in the
    results directory ($D500_HOME, or the default ./d500-results): one line naming the file and
    where its name came from; "" where the file is there. Looks only, creates nothing."""
    if path is not None:
        if Path(path).is_file():  # empty: not a ledger (one d500 wrote never is), which SQLite
            return "" if Path(path).stat().st_size else (  # took as one and d500 filled
                f"--ledger {path}: an empty file, not a ledger (d500 writes its ledgers as "
                f"$D500_HOME/ledger.sqlite)")
        return (f"--ledger {path}: " + ("is a folder, not a ledger file" if Path(path).is_dir()
                                        else f"no such ledger file{looked_in(path)}"))
    named = home_named()
    folder = Path(named).expanduser().resolve()
    file = folder / "ledger.sqlite"
    if file.exists():  # (one SQLite cannot open says so itself)
        return ""
    where = (f"$D500_HOME={named}" if os.environ.get("D500_HOME") else f"the default home "
             f"./{named} ($D500_HOME is {'empty' if 'D500_HOME' in os.environ else 'unset'})")
    if folder.exists() and not folder.is_dir():
        return f"{where}: is a file, not a results directory (no ledger to read)"
    what = "has no ledger.sqlite yet" if folder.is_dir() else "does not exist"
    return (f"no ledger at {file}: {where} {what}; check the path, or record runs first (d500 "
            f"run, d500 train, d500 op bench ...)")


class Store:
    """One SQLite ledger file, safe to use from several processes and threads at once."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else home() / "ledger.sqlite"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # (a file where a folder goes: one line, not a traceback)
            from d500.paths import unwritable
            raise UsageError(f"{self.path}: cannot make its folder "
                             f"({unwritable(self.path, err)})") from None
        self.root = self.path.parent.resolve()
        self._lock = threading.RLock()
        self._db = self._open(time.monotonic() + OPEN_PATIENCE)
        self._db.row_factory = sqlite3.Row

    def _open(self, deadline: float) -> sqlite3.Connection:
        """Connect, switch to WAL and bring the schema up to date. Several processes opening a
        new ledger at once can meet SQLITE_BUSY where SQLite calls no busy handler (seen once in
        CI while another process set WAL mode up), so a busy open is retried until `deadline`."""
        while True:
            try:  # a folder SQLite cannot create the file in: one line, not a traceback
                db = sqlite3.connect(self.path, timeout=60, isolation_level=None,
                                     check_same_thread=False)
            except sqlite3.OperationalError as err:
                raise self._unusable(err) from None
            try:
                db.execute("PRAGMA busy_timeout = 60000")
                migrations.refuse_foreign(db, self.path)  # another program's database: as it was
                for _ in range(50):
                    if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() == "wal":
                        break
                    time.sleep(0.05)
                db.execute("PRAGMA synchronous = FULL")
                db.execute("PRAGMA foreign_keys = ON")
                self.schema_version = migrations.upgrade(db, self.path)
                return db
            except sqlite3.OperationalError as err:
                db.close()
                code = getattr(err, "sqlite_errorcode", 0) & 0xFF
                busy = code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise self._unusable(err) from None
            except sqlite3.DatabaseError as err:
                db.close()
                raise self._unusable(err) from None
            except BaseException:
                db.close()
                raise

    def _unusable(self, err: sqlite3.DatabaseError) -> D500Error:
        """The one-line error for a file SQLite cannot use as a ledger, with SQLite's code."""
        name = getattr(err, "sqlite_errorname", None)
        return D500Error(f"{self.path}: not a usable ledger database: {err}"
                         + (f" ({name})" if name else ""))

    @classmethod
    def open_for_reading(cls, path: str | Path | None = None) -> Self:
        """The ledger a command that only reads opens (`--ledger FILE`, default $D500_HOME's),
        which must exist: a mistyped path is a UsageError naming it and where it came from,
        and nothing is created (it made an empty home and ledger, and an empty board)."""
        missing = absent(path)
        if missing:
            raise UsageError(missing)
        return cls(path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
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

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees one state while other processes write."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    # -- paths are stored relative to the ledger's folder or the project when inside them
    def store_path(self, path: str | Path) -> str:
        return stored_path(path, self.root)

    def resolve_path(self, stored: str) -> Path:
        if stored.startswith(HOME_PREFIX):
            return self.root / stored[len(HOME_PREFIX):]
        p = Path(stored)
        return p if p.is_absolute() else PROJECT_ROOT / p
