"""The model handed from a worker to its judge through shared memory, not pickled through the
pipe: a memory file the judge creates and seals against resizing, laid out by the judge.

    board = Board.create(judge.shapes, judge.dtypes)  # the judge, before the clock (None: no
    offer(conn, board)                                # memfd here); the layout, the fd after it
    board = accept(conn, message)                     # the worker, given ("handover", layout)
    board.put(state) and conn.send(("trained", losses, SHARED, ...))  # the worker
    state = board.take()                              # the judge: its own copy, checked

The training split goes the other way on a board of its own (d500.training.worker's "shelf"):
the judge creates it before the clock from the split's known layout, both sides fault its
pages in (`touch`) before the clock, and after the clock the judge writes the split there and
sends SHARED in place of the arrays, which the worker then reads in place. The judge never
reads it back: what the worker writes there changes nothing the judge holds.

The worker writes its parameters and running statistics there, then sends a one-byte-sized
notice (SHARED in place of the state) through the pipe. The judge copies the whole buffer into
memory of its own and compares the two bitwise: the worker's code can write the shared memory
at any time, and a write the judge's copy could have caught half-way (its hand-over changed
after it said it was done) fails the run. The judge then evaluates its own copy, never the live
buffer, and a write after the comparison changes nothing it judges. What a worker could gain is
bounded by the copy: writes that land after its notice and before the copy reaches them, a few
microseconds (tests/training/test_handover.py performs both attacks). Nothing the judge reads
from the buffer decides where anything is: the layout is the judge's, from its own model; a
seal (F_SEAL_SHRINK, F_SEAL_GROW) keeps the worker from truncating the file under the judge's
mapping (a SIGBUS in the judge). Where memfd or fd passing is missing, the state is pickled
through the pipe as before, and level 3's rank 0 always pickles it.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

SHARED = "shared"  # in a "trained" or "state" message: the state is on the board
ALIGN = 64  # bytes: each array starts on a cache line


class Changed(Exception):
    """The shared hand-over changed while the judge copied it."""


class Board:
    """A shared memory file laid out as the judge's arrays, mapped in one process."""

    def __init__(self, fd: int, layout: list[tuple[str, str, tuple[int, ...], int]], size: int):
        self.fd, self.layout, self.size = fd, layout, size
        self.memory = mmap.mmap(fd, size)  # shared, read and write
        self.raw = np.frombuffer(self.memory, np.uint8)
        self.views = {name: np.ndarray(shape, np.dtype(dtype), self.memory, offset)
                      for name, dtype, shape, offset in layout}

    @classmethod
    def create(cls, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]
               ) -> Board | None:
        """The judge's board for arrays of these shapes and dtypes; None where the system has
        no sealable memfd."""
        if not hasattr(os, "memfd_create") or not hasattr(os, "MFD_ALLOW_SEALING"):
            return None
        import fcntl
        layout, size = [], 0
        for name, shape in shapes.items():
            dtype = np.dtype(dtypes[name])
            layout.append((name, dtype.str, tuple(int(d) for d in shape), size))
            size += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN
        size = max(size, ALIGN)
        try:
            fd = os.memfd_create("d500-handover", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:
            return None
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return cls(fd, layout, size)

    def touch(self, write: bool) -> None:
        """Fault every page of the board in before it is timed (`write`: the judge's, which
        allocates the pages; else the worker's, which maps them): its use then faults none."""
        page = mmap.PAGESIZE
        if write:
            self.raw[::page] = 0
        else:
            int(self.raw[::page].sum())

    def put(self, state: dict[str, Any]) -> bool:
        """The worker: write `state` into the board, cast to the judge's dtypes; False (nothing
        meant) when an array is missing, not numbers or of another shape: then the state goes
        pickled, and the judge's load says what is wrong with it."""
        values = []
        for name, view in self.views.items():
            value = np.asarray(state.get(name)) if name in state else None
            if value is None or value.shape != view.shape or value.dtype.kind not in "biuf":
                return False
            values.append((view, value))
        for view, value in values:
            np.copyto(view, value, casting="unsafe")  # as the judge's astype would cast it
        return True

    def take(self) -> dict[str, np.ndarray]:
        """The judge: the board's arrays copied into memory of this process only, after
        checking that the copy equals the board (Changed if the worker wrote meanwhile)."""
        own = np.empty(self.size, np.uint8)
        np.copyto(own, self.raw)
        if not np.array_equal(own.view(np.uint64), self.raw.view(np.uint64)):
            raise Changed
        return {name: np.ndarray(shape, np.dtype(dtype), own.data, offset)
                for name, dtype, shape, offset in self.layout}

    def close(self) -> None:
        self.views = {}
        self.raw = None
        try:
            self.memory.close()
        except BufferError:  # an array still refers to it: the mapping goes with the process
            pass
        os.close(self.fd)


def offer(conn: Any, board: Board, what: str = "handover") -> bool:
    """The judge: tell the worker the layout (in a message named `what`) and pass it the
    board's fd over the pipe (a Unix socket); False where fds cannot pass (the worker then
    pickles its state)."""
    from multiprocessing import reduction
    if not getattr(reduction, "HAVE_SEND_HANDLE", False):
        return False
    conn.send((what, board.layout, board.size))
    reduction.send_handle(conn, board.fd, None)
    return True


def accept(conn: Any, message: tuple[Any, ...]) -> Board:
    """The worker: the board the judge offered in `message` (its fd follows on `conn`)."""
    from multiprocessing import reduction
    fd = reduction.recv_handle(conn)
    return Board(fd, [(n, d, tuple(s), o) for n, d, s, o in message[1]], int(message[2]))
