"""Start-up agreement of the ranks of a level-3 run: they run the same command on the same workload
and entry (digests compared), and a check that fails on one rank fails on all of them, so every
rank prints the same one line and exits 2 instead of the others waiting forever.

    agree_on_inputs(comm, workload_path, submission_dir, argv)   # before anything is parsed
    value = together(comm, lambda: check(...))                    # raise on every rank, or none

Digests are exchanged with a fixed-size Allgather of 32-byte SHA-256 values (the buffer
interface); errors, a few short strings, with mpi4py's small-object allgather.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from d500.errors import ConfigError, D500Error, describe

T = TypeVar("T")


def digest_files(path: str | Path) -> bytes:
    """SHA-256 over a file, or over every file under a folder (relative names and contents, no
    bytecode); a missing path digests as such, so that the comparison, not this rank, reports
    it."""
    h = hashlib.sha256()
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts
                       and f.suffix != ".pyc")
        for f in files:
            h.update(str(f.relative_to(p)).encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    elif p.is_file():
        h.update(p.read_bytes())
    else:
        h.update(b"missing:" + str(p).encode())
    return h.digest()


def agree_on_inputs(mpi: Any, items: Sequence[tuple[str, Callable[[], bytes]]]) -> None:
    """Every rank digests each (what, digest function) and compares with every other rank; a
    disagreement is a ConfigError raised on every rank naming what differs and which ranks."""
    import numpy as np

    mine = np.frombuffer(b"".join(fn() for _, fn in items), dtype=np.uint8)
    every = np.empty((mpi.Get_size(), mine.size), dtype=np.uint8)
    mpi.Allgather(mine, every)
    for i, (what, _) in enumerate(items):
        cut = slice(32 * i, 32 * (i + 1))
        groups: dict[bytes, list[int]] = {}
        for rank in range(every.shape[0]):
            groups.setdefault(every[rank, cut].tobytes(), []).append(rank)
        if len(groups) > 1:
            parts = "; ".join(f"rank(s) {', '.join(map(str, ranks))}: {d.hex()[:12]}"
                              for d, ranks in groups.items())
            raise ConfigError(f"the ranks disagree on {what} ({parts}); every rank must run "
                              f"the same command on the same files")


def together(mpi: Any, check: Callable[[], T]) -> T:
    """Run `check` on every rank, then compare outcomes: if it raised on any rank, every rank
    raises that rank's error as a D500Error (a crash: exit code 1) (the lowest failing rank's,
    prefixed with its number when the ranks differ); otherwise every rank returns its own
    value."""
    try:
        value, failure = check(), None
    except Exception as err:  # noqa: BLE001 - any failure here must reach every rank
        text = str(err) if isinstance(err, D500Error) else describe(err)
        value, failure = None, (type(err).__name__, text, getattr(err, "exit_code", 1))
    failures = mpi.allgather(failure)
    bad = [(rank, f) for rank, f in enumerate(failures) if f is not None]
    if not bad:
        return value  # type: ignore[return-value]
    rank, (_, text, code) = bad[0]
    same = len(bad) == len(failures) and all(f[1] == text for _, f in bad)
    err = D500Error(text if same else f"rank {rank}: {text}")
    err.exit_code = code
    raise err
