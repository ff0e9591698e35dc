"""Level 0's operator host: an entry's operator file imported and run in a process of its own, so
that the judge (the clock, the reference, the comparisons, the ledger) shares no process with it.

    cls = RemoteClass.start(Path("conv.py"), "Im2colConv")  # the file is imported there only
    run = runner(cls(**attributes))      # a RemoteRunner: forward and gradients as NumPy
    fn = run.timed_forward(inputs)       # a call is one round trip of fn.inner forward calls
    cls.close()

The judge compares what the host returns against its own reference and times round trips from
its side of the pipe: each round trip runs the timed call `inner` times, `inner` chosen so that
the cost of an empty round trip, measured first, is under 1 % of a round trip. Code that
patches `time.perf_counter` on import changes only the host's clocks, which time nothing. The
host ends with the judge (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import math
import multiprocessing
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from d500 import children, untrusted
from d500.errors import D500Error, UsageError

ROUND_TRIP = 0.05  # seconds of timed calls per round trip at least
OVERHEAD = 0.01  # the largest share of a round trip its own cost may take
MAX_INNER = 100_000
START = 300.0  # seconds the host may take to import the operator's file


class Raised(D500Error):
    """The operator raised in the host: the message is its type, text and innermost frame."""


class Host:
    """The judge's handle on one host process."""

    def __init__(self, file: Path, name: str):
        from d500 import threads
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=main, args=(child,), name="d500-operator-host",
                                   daemon=True)
        self.process.start()
        child.close()
        self.conn.send((str(file), name, threads.recorded()))

    def ask(self, *message: Any) -> Any:
        """Send one request, return its reply (an operator that raised: Raised)."""
        try:
            self.conn.send(message)
            if not self.conn.poll(START):
                raise D500Error(f"the operator host did not answer '{message[0]}' within "
                                f"{START:g} s")
            kind, value = untrusted.receive(self.conn)  # its pickles may call nothing here
        except (EOFError, OSError, BrokenPipeError):
            self.process.join(timeout=5)
            raise Raised(f"the operator's process ended (exit code {self.process.exitcode}) "
                         f"during '{message[0]}'") from None
        except (untrusted.Forbidden, TypeError, ValueError) as err:
            raise Raised(f"the operator's process answered '{message[0]}' with what d500 "
                         f"does not read: {err}") from None
        if kind == "raised":
            raise Raised(value)
        if kind == "refused":
            raise UsageError(value)
        return value

    def close(self) -> None:
        children.end(self.conn, self.process)


class RemoteClass:
    """What the judge knows of an operator class that lives in a host: its declared facts.
    Calling it makes an instance there (a RemoteOperator)."""

    def __init__(self, host: Host, facts: dict[str, Any]):
        self.host = host
        weakref.finalize(self, host.close)  # the host ends when the judge is done with it
        self.__name__ = facts["name"]
        self.framework, self.op_type = facts["framework"], facts["op_type"]
        self.opset, self.source = facts["opset"], facts["source"]
        self.source_file = facts["source_file"]
        self._own_backward = facts["has_backward"]

    @classmethod
    def start(cls, file: Path, name: str) -> RemoteClass:
        """Import `file` in a new host and check its class `name` there (a UsageError, as an
        in-process import gives, when the file or class is wrong)."""
        host = Host(file, name)
        try:
            return cls(host, host.ask("facts"))
        except BaseException:
            host.close()
            raise

    def has_backward(self) -> bool:
        return self._own_backward

    def __call__(self, **attributes: Any) -> RemoteOperator:
        self.host.ask("make", attributes)
        return RemoteOperator(self)

    def close(self) -> None:
        self.host.close()


class RemoteOperator:
    """The host's current operator instance (one at a time)."""

    def __init__(self, cls: RemoteClass):
        self.cls, self.framework = cls, cls.framework

    def runner(self) -> RemoteRunner:
        return RemoteRunner(self.cls)


class RemoteRunner:
    """d500.operators.adapters.Runner's interface over the host (NumPy in and out)."""

    def __init__(self, cls: RemoteClass):
        self.host, self.own_backward = cls.host, cls.has_backward()
        from d500.operators.base import autograd
        self.has_gradients = self.own_backward or autograd(cls.framework)

    def forward(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return self.host.ask("forward", [np.asarray(a) for a in arrays])

    def gradients(self, arrays: list[np.ndarray], grad_outputs: list[np.ndarray | None]
                  ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        return self.host.ask("gradients", [np.asarray(a) for a in arrays], list(grad_outputs))

    def timed_forward(self, inputs: list[np.ndarray]) -> Batched:
        self.host.ask("prepare", "forward", inputs, None)
        return Batched(self.host, "forward")

    def timed_backward(self, inputs: list[np.ndarray], grads: list[np.ndarray | None]
                       ) -> Batched | None:
        if not self.host.ask("prepare", "backward", inputs, grads):
            return None
        return Batched(self.host, "backward")


class Batched:
    """One timed call: a round trip in which the host runs the prepared call `inner` times,
    `inner` chosen so that the round trip's own cost (the slowest of a few empty round trips:
    a process's wake-up on a busy machine takes milliseconds) is under OVERHEAD of it. The
    calls are sized by the host's own reading of its time, which the judge uses for nothing
    else: a host that misreports it only makes its own round trips costlier or longer."""

    def __init__(self, host: Host, kind: str):
        self.host, self.kind = host, kind
        self.overhead = max(self._round_trip(0) for _ in range(5))
        target = max(ROUND_TRIP, self.overhead / OVERHEAD)
        calls = 1
        while True:
            inside = float(host.ask("repeat", kind, calls))
            if inside >= target / 8 or calls >= MAX_INNER:
                break
            calls = min(MAX_INNER, calls * 4)
        per_call = max(inside / calls, 1e-9)
        self.inner = max(1, min(MAX_INNER, math.ceil(target / per_call)))

    def _round_trip(self, calls: int) -> float:
        t = time.perf_counter()
        self.host.ask("repeat", self.kind, calls)
        return time.perf_counter() - t

    def __call__(self) -> None:
        self.host.ask("repeat", self.kind, self.inner)


def main(conn: Any) -> None:
    """The host process: import the file, then answer requests until told to exit."""
    from d500.children import bound_to_parent
    bound_to_parent()
    file, name, recorded = conn.recv()
    try:
        cls = _load(Path(file), name, recorded)
    except UsageError as err:
        _serve_refusal(conn, str(err))
        return
    state: dict[str, Any] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "exit":
            return
        try:
            conn.send(("ok", _answer(cls, state, message)))
        except Exception as err:  # noqa: BLE001 - the operator's failure, as one line
            from d500.errors import describe
            conn.send(("raised", describe(err)))


def _load(file: Path, name: str, recorded: dict[str, Any] | None) -> Any:
    from d500 import threads
    from d500.operators.base import load_class
    cls = load_class(file, name).cls
    if recorded is not None:
        threads.configure(modules=threads.frameworks([cls.framework]),
                          fallback=(recorded["count"], recorded["set_by"]))
    return cls


def _serve_refusal(conn: Any, text: str) -> None:
    """Answer the first request with the import's UsageError."""
    try:
        conn.recv()
        conn.send(("refused", text))
    except (EOFError, OSError):
        pass


def _answer(cls: Any, state: dict[str, Any], message: tuple[Any, ...]) -> Any:
    from d500.operators.adapters import runner
    kind = message[0]
    if kind == "facts":
        from d500.operators.base import source_path
        return {"name": cls.__name__, "framework": cls.framework, "op_type": cls.op_type,
                "opset": cls.opset, "source": cls.source, "has_backward": cls.has_backward(),
                "source_file": str(source_path(cls)) if cls.framework == "c" else None}
    if kind == "threads":  # what the operator's frameworks run with in this process
        from d500 import threads
        return threads.actual()
    if kind == "make":
        state.clear()
        state["run"] = runner(cls(**message[1]))
        return None
    run = state["run"]
    if kind == "forward":
        return run.forward(message[1])
    if kind == "gradients":
        return run.gradients(message[1], message[2])
    if kind == "prepare":
        _, which, inputs, grads = message
        call = run.timed_forward(inputs) if which == "forward" else run.timed_backward(inputs,
                                                                                       grads)
        state[which] = call
        return call is not None
    if kind == "repeat":  # replies with the host's own reading, which the judge never uses
        call = state[message[1]]
        t = time.perf_counter()
        for _ in range(message[2]):
            call()
        return time.perf_counter() - t
    raise D500Error(f"the operator host got an unknown request '{kind}'")
