"""Level 1's backend host: a backend that is not d500's own runs in a process of its own, timed
from the judge's side of the pipe.

    backends.host_plugins()             # this process never imports a third-party backend
    cls = backend("tiny")               # a HostedBackend: its module is imported in the host only
    exe = cls.prepare(path)             # a HostedExecutable: run, gradients, settings as NumPy
    fn = exe.timed("forward", feeds)    # a call is one round trip of fn.inner forward calls
    close_all()

A backend registered under the `d500.backends` entry point runs in d500's process unless it is
hosted: code it runs on import (or in any call) could patch `time.perf_counter` and halve every
figure the judge records (tests/networks/test_clock_attack.py). `d500 net bench`, `net check`,
`run` and `reproduce` of a level-1 run call `host_plugins()` before anything could import one;
a backend whose module this process imported before is refused a host (`backend`). Hosted, it
changes only the host's clocks, which time nothing. The host is spawned, kept (children.keep)
and confined (children.confine) before the backend's module is imported; the judge is shielded
(children.shield), reads every answer with d500.untrusted.receive, and the host ends with it.

Timing is level 0's (d500.operators.host.Batched): each round trip runs the timed call (an
inference pass, a training step) `inner` times, `inner` sized so that an empty round trip,
measured first, costs under 1 % of a round trip; the figure is a round trip's time / inner.
Empty round trips measured back to back undercount what a round trip costs while timing, where
the host sleeps while the other rows run: on 2 loaded cores (load 7.6) 1.5-9 % of a 0.05 s
round trip was outside the host's own reading of its calls, 0.2-0.7 % of a 0.4 s one
(benchmarks/hosted_backend.py, README). So net bench asks for round trips of at least a
TRIPS-th of its budget (0.25 s at the usual 2 s), and records the share it saw outside the
host's reading (`outside`, the host's word: a diagnostic, never a figure).

What the judge checks of a round trip is level 0's (d500.operators.host: its `Batched`, its
host's `_checked_calls`, run here through `CallRunner`, a level-0 Runner over the feeds): every
call of a round trip runs on the feeds with the first float input (else the token ids, below)
shifted by its own amounts (level 0's rule), drawn from a seed the judge sends with the round
trip, and returns its outputs (a training step's outputs and its gradients) as checksums, dot
products with weights one per element, from a key the judge sends when the call is prepared.
After timing, the judge draws CHECKED calls from all round trips, recomputes them with the
reference backend and compares their checksums at d500.networks.compare's tolerance (rtol_for,
relative to each output's peak) by level 0's statistical bound (`CheckedCall.check`). A host
cannot know which calls are checked, and must run each: one that runs a round trip's last call
alone and copies its checksums, or answers the earlier calls with outputs it computed before, is
recorded failed (tests/networks/test_call_count.py; on the protocol before, which checked each
round trip's last call only, a host running the last call alone passed with a latency of 20 ns
to the honest host's 257 us, its round trips grown to MAX_INNER calls). Before timing, the
shifts are sized with the reference as level 0 sizes them (`Batched.calibrate`, given the
reference's executable by net bench): at level 0's first scale the check told apart 0.02-0.5 of
pairs of mlp-mnist's calls at batch 1 and 0.02-0.16 at batch 64 (the network averages the shift
out), grown 0.80-1.00. That power is recorded (`calls_told_apart`, the share q of pairs of
recomputed calls a copy of one for the other would fail): a host skipping a share f of its calls
is caught with probability 1 - (1 - f q) ** CHECKED. The reference's recomputation costs a few
seconds per timed call on the larger models (light-resnet50 at batch 1, 2.9 s a call), and the
sizing up to PROBES * (GROWTHS + 1) = 24 calls more, which is why CHECKED is not level 0's 32.
Open: a host skipping half its calls escapes one timed call's check with probability (1 - q/2)
** 6, 1.6 % at q = 1.

A model with no float input (token ids alone: bert-base-shaped, text-lm) has its ids shifted
instead (`CallRunner.shifted`; `_ordered` picks the first integer input that gathers an
embedding's rows, d500.networks.inputs.token_ids): call i's id j is (x_j + p[(j + r_i) %
PATTERN]) mod V, V the embedding's rows, p level 0's pattern drawn at scale 2V (`_scale_of`:
uniform integers in [0, V)). Every id stays inside the vocabulary, and each is uniform over it
whatever x is, at every position of every call, so two calls' ids differ at about 1 - 1/V of
positions: no call is another's prefix (a transformer's cached keys and values of an unchanged
prefix would answer a call that changed a suffix, or one position), and a row of L ids recurs in
another call with probability V ** -L. Before, such a model's calls ran unchecked: a host
running a round trip's last call alone passed with a latency of 17 ns
(tests/networks/test_call_count_ids.py, a small text-lm; now recorded failed, and so is one
answering with stale outputs). The host learns p from the key when the call is prepared, as for
floats: a table of every roll's outputs would take PATTERN full passes. A model with integer
inputs none of which indexes an embedding (nothing says which values are valid) is still
unchecked, and its row says so (`hosted_note`).

Every row pays the check alike: built-in backends (d500's own code) stay in the judge's process
and their timed calls run through the same checked round trips there (`checked_local`, level
0's `Local`: no pipe), unverified, as level 0's built-in rows are. What a hosted row pays more,
and what checking every call costs against the loop that checked each round trip's last call
only, is measured by benchmarks/hosted_backend.py (README).
"""

from __future__ import annotations

import math
import secrets
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from d500 import children
from d500.errors import D500Error, UsageError, describe
from d500.heap import allocator
from d500.networks.compare import rtol_for
from d500.networks.inputs import token_ids
from d500.operators.adapters import Runner
from d500.operators.dtypes import is_float
from d500.operators.host import (
    MAX_INNER,
    PROBES,
    Batched,
    Host,
    Local,
    _power,
    _rolls,
    serve,
    serve_refusal,
)
from d500.operators.host import _answer as operator_answer

CHECKED = 6  # calls the judge recomputes with the reference after timing, from all round trips

_hosts: dict[str, HostedBackend] = {}


def backend(name: str) -> Any:
    """The class of backend `name`: hosted when it is not d500's own (d500.backends.hosted),
    one host per backend per process; else the backend class itself."""
    import sys

    from d500 import backends
    if not backends.hosted(name):
        return backends.get(name)
    module = backends.available()[backends.split(name)[0]].partition(":")[0]
    if module in sys.modules:  # its import ran here: a clock it patched would time the others
        raise D500Error(f"backend '{name}' was imported into d500's own process before it was "
                        f"hosted ({module}): run it from a d500 command of its own")
    if name not in _hosts:
        _hosts[name] = HostedBackend.start(name)
    return _hosts[name]


def close_all() -> None:
    """End every host this process started."""
    while _hosts:
        _hosts.popitem()[1].close()


class HostedBackend:
    """What the judge knows of a hosted backend class: the facts its host reports."""

    def __init__(self, host: Host, facts: dict[str, Any]):
        self.host = host
        weakref.finalize(self, host.close)
        self.name, self.framework = str(facts["name"]), str(facts["framework"])
        self.trainable = bool(facts["trainable"])
        self._version = facts["version"]

    @classmethod
    def start(cls, name: str) -> HostedBackend:
        host = Host(main, "backend", name)
        try:
            return cls(host, host.ask("facts"))
        except BaseException:
            host.close()
            raise

    def version(self) -> str | None:
        return None if self._version is None else str(self._version)

    def prepare(self, model: str | Path | onnx.ModelProto) -> HostedExecutable:
        """Translate `model` (a file, or a model sent as bytes) in the host."""
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        # a file the host does not see (a generated model in the results directory's cache,
        # which its mount namespace hides: d500.children.keep), as bytes
        sent = proto.SerializeToString() if isinstance(model, onnx.ModelProto) or \
            children.hidden(model) else str(model)
        return HostedExecutable(self.host, self.host.ask("prepare", sent), proto)

    def close(self) -> None:
        self.host.close()


class HostedExecutable:
    """d500.backends.base.Executable's interface as level 1's bench uses it, over the host."""

    def __init__(self, host: Host, facts: dict[str, Any], model: onnx.ModelProto):
        self.host, self.model, self.id = host, model, int(facts["id"])
        self.parameter_names = [str(n) for n in facts["parameter_names"]]
        self._settings = dict(facts["settings"] or {})
        for key in ("precision", "compile_time", "compile_cache", "baked_inputs"):
            if facts.get(key) is not None:  # the backend's word, as in d500's process
                setattr(self, key, facts[key])
        if not _float_dtype(getattr(self, "precision", None)):
            self.precision = None  # a lower precision only where NumPy names a float dtype

    def settings(self) -> dict[str, Any]:
        return self._settings

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.host.ask("run", self.id, feeds))

    def gradients(self, feeds: dict[str, np.ndarray], *, output: str | None = None,
                  wrt: list[str] | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
        outs, grads = self.host.ask("gradients", self.id, feeds, output, wrt)
        return list(outs), dict(grads)

    def timed(self, kind: str, feeds: dict[str, np.ndarray], output: str | None = None,
              wrt: list[str] | None = None, trip: float = 0.0, reference: Any = None
              ) -> CheckedCall:
        """The timed call `kind` ("forward": run; "step": gradients) as checked round trips in
        the host, each at least `trip` seconds long; given the reference backend's executable
        of the model, the shifts are sized first so that the check tells calls apart
        (level 0's `Batched.calibrate`)."""
        names, inputs, vocab = _ordered(feeds, self.model)
        key = secrets.randbits(63)  # the checksums' weights and the shifts' pattern
        call = int(self.host.ask("time", self.id, kind, names, inputs, output, wrt, key, vocab))
        return CheckedCall(_Routed(self.host, call), kind, names, inputs, key, output, wrt,
                           trip, precision=getattr(self, "precision", None), model=self.model,
                           reference=reference, vocab=vocab)


def checked_local(exe: Any, kind: str, feeds: dict[str, np.ndarray], output: str | None = None,
                  wrt: list[str] | None = None, trip: float = 0.0) -> CheckedCall:
    """The timed call `kind` of a built-in backend's executable `exe`, in this process: the same
    checked calls as a hosted one's, so that every row of a comparison pays the check alike
    (level 0's `Local`)."""
    names, inputs, vocab = _ordered(feeds, getattr(exe, "model", None))
    key = secrets.randbits(63)
    local = Local(CallRunner(exe, kind, names, output, wrt, vocab))
    _prepare(local.state, inputs, key)
    return CheckedCall(local, kind, names, inputs, key, output, wrt, trip,
                       precision=getattr(exe, "precision", None), model=getattr(exe, "model", None),
                       vocab=vocab)


class CallRunner(Runner):
    """An executable's timed call as a level-0 Runner over its feeds in `names` order (the
    shifted one first): a forward's outputs, or a training step's outputs and then its
    gradients by name, as one list. With `vocab`, the first feed is token ids, each call's
    shifted ones taken modulo `vocab` (`shifted`)."""

    def __init__(self, exe: Any, kind: str, names: list[str], output: str | None,
                 wrt: list[str] | None, vocab: int | None = None):
        self.exe, self.kind, self.names = exe, kind, names
        self.output, self.wrt, self.own_backward = output, wrt, False
        self.vocab = vocab

    def shifted(self, arrays: Any, second: int | None = None) -> Any:
        """Level 0's shift of the first feed; token ids then wrapped into the vocabulary, in
        place: call i's id j is (x_j + p[(j + r_i) % PATTERN]) mod vocab, p uniform in [0,
        vocab), a new id at every position (but one in vocab) in every call."""
        shift, vocab = super().shifted(arrays, second), self.vocab
        if vocab is None:
            return shift

        def ids(offsets: np.ndarray, more: np.ndarray | None = None) -> list[Any]:
            native = shift(offsets, more)
            np.remainder(native[0], vocab, out=native[0])
            return native
        return ids

    def call(self, native: Any) -> list[Any]:
        feeds = dict(zip(self.names, native))
        if self.kind == "forward":
            return list(self.exe.run(feeds))
        outs, grads = self.exe.gradients(feeds, output=self.output, wrt=self.wrt)
        return [*outs, *(grads[k] for k in sorted(grads))]

    def _numpy(self, value: Any) -> Any:
        return np.asarray(value)


class _Routed:
    """Level 0's requests of one timed call, sent to the backend host that holds it."""

    def __init__(self, host: Host, call: int):
        self.host, self.call = host, call

    def ask(self, *message: Any) -> Any:
        return self.host.ask("call", self.call, *message)


class CheckedCall(Batched):
    """One timed call of a level-1 executable (an inference pass, a training step) as level 0's
    checked round trips (d500.operators.host.Batched): `inner` calls each, sized by level 0's
    rule and to last at least `trip` s, call i on the first float input shifted by its own
    amounts, each call's outputs returned as checksums; `check` recomputes CHECKED calls drawn
    from all round trips with the reference."""

    host_name = "backend"

    def __init__(self, host: Any, kind: str, names: list[str], inputs: list[np.ndarray],
                 key: int, output: str | None, wrt: list[str] | None, trip: float = 0.0, *,
                 precision: str | None = None, model: onnx.ModelProto | None = None,
                 reference: Any = None, vocab: int | None = None):
        self.what, self.names, self.output, self.wrt = kind, names, output, wrt
        self.vocab = vocab  # the first input is token ids below it (`_scale_of`)
        self.label = "training step" if kind == "step" else "forward"
        self.outside: list[float] = []  # each round trip's share outside the host's reading
        self.precision = precision  # a lower precision it computes in (its word)
        self.model = model  # what it runs: its outputs' dtypes
        super().__init__(host, "forward", inputs, key,
                         None if reference is None else self._reference(reference),
                         (0.0, self._tolerance()))
        if trip > 0:  # longer round trips: a woken host's delay is a smaller share of each
            per_call = max(float(self._ask(self.inner)[0]) / self.inner, 1e-9)
            self.inner = min(MAX_INNER, max(self.inner, math.ceil(trip / per_call)))
        self.outside.clear()

    def _ask(self, calls: int) -> Any:
        t = time.perf_counter()
        inside, sums = super()._ask(calls)
        took = time.perf_counter() - t
        if calls and isinstance(inside, float) and took > 0:  # the host's word: a diagnostic
            self.outside.append(max(0.0, 1.0 - inside / took))
        return inside, sums

    def check(self, reference: Any, samples: int = CHECKED) -> str | None:
        """Recompute `samples` of the calls run, drawn from all round trips after timing, with
        `reference` (the reference backend's executable of the same model); what is wrong, or
        None."""
        return self.verify(self._reference(reference), 0.0, self._tolerance(), samples=samples)

    def _scale_of(self, x: np.ndarray) -> float | None:
        """Level 0's scale for a float input; for token ids, twice the vocabulary: level 0's
        pattern (`_pattern`) then draws each offset uniform in [0, vocab)."""
        if self.vocab is not None and x.dtype.kind in "iu" and x.size:
            return 2.0 * self.vocab
        return super()._scale_of(x)

    def calibrate(self, reference: Any, rtol: float, atol_frac: float) -> None:
        """Level 0's sizing of a float input's shift; token ids are uniform over the
        vocabulary at any scale, so their power is measured once, on PROBES calls, and the
        scale never grown (each growth would cost PROBES recomputed calls for nothing)."""
        if self.vocab is None or self._varied().dtype.kind not in "iu":
            return super().calibrate(reference, rtol, atol_frac)
        rolls, turns = _rolls(secrets.randbits(62), PROBES)
        try:
            self.power = _power([self._reference_sums(reference, r, t, rtol, atol_frac)
                                 for r, t in zip(rolls, turns)], model=True)
        except D500Error as err:  # the reference cannot run a call: `verify` will say so
            self.unverified = str(err)
        return None

    def _reference(self, exe: Any) -> Any:
        """The reference executable's call on this call's inputs (a list, as shifted: token ids
        wrapped into the vocabulary as the host's CallRunner wraps them); what it raises, a
        D500Error (level 0's: no call checked, `unverified` says why)."""
        run = CallRunner(exe, self.what, self.names, self.output, self.wrt).forward
        vocab = self.vocab

        def call(arrays: list[np.ndarray]) -> list[np.ndarray]:
            if vocab is not None and arrays[0].dtype.kind in "iu":
                arrays = [np.remainder(arrays[0], vocab), *arrays[1:]]
            try:
                return run(arrays)
            except Exception as err:  # noqa: BLE001 - the reference's failure, named
                raise D500Error(describe(err)) from err
        return call

    def _tolerance(self) -> float:
        """d500.networks.compare's tolerance, relative to an output's peak, at the loosest of
        the model's float outputs (and a step's float32 gradients) at its precision."""
        dtypes = [np.dtype(np.float32)]
        if self.model is not None:
            for o in self.model.graph.output:
                try:
                    dtypes.append(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
                        o.type.tensor_type.elem_type)))
                except (KeyError, TypeError, ValueError):
                    continue
        return max(rtol_for(d, self.precision) for d in dtypes if d.kind in "fc")


def _prepare(state: dict[str, Any], inputs: list[np.ndarray], key: int) -> None:
    """Prepare a CallRunner's (state["run"]) calls as level 0 prepares a forward: checked, and
    unchecked for a model with neither a float input nor token ids to shift (Batched then runs
    those)."""
    operator_answer(None, state, ("prepare", "forward", inputs, None, key))
    if not inputs[0].size or not (is_float(inputs[0].dtype) or state["run"].vocab is not None):
        operator_answer(None, state, ("prepare", "forward", inputs, None))


def _ordered(feeds: dict[str, np.ndarray], model: onnx.ModelProto | None = None
             ) -> tuple[list[str], list[np.ndarray], int | None]:
    """The feeds' names and arrays, the one each call shifts first: the first float input,
    else the first integer input `model` gathers an embedding's rows by (token ids,
    d500.networks.inputs.token_ids), with the rows (None for a float input, or none)."""
    names = list(feeds)
    ids = token_ids(model) if model is not None else {}
    first = next((n for n in names if is_float(np.asarray(feeds[n]).dtype)
                  and np.asarray(feeds[n]).size), None)
    if first is None:
        first = next((n for n in names if n in ids and np.asarray(feeds[n]).dtype.kind in "iu"
                      and np.asarray(feeds[n]).size), None)
    if first is not None:
        names.remove(first)
        names.insert(0, first)
    vocab = ids[first] if first is not None and first in ids and not is_float(
        np.asarray(feeds[first]).dtype) else None
    return names, [np.asarray(feeds[n]) for n in names], vocab


def _float_dtype(name: Any) -> bool:
    """Whether `name` is a precision d500.networks.compare can judge at (a dtype's name)."""
    if not isinstance(name, str):
        return False
    try:
        rtol_for(np.dtype(np.float32), name)
    except (TypeError, ValueError, KeyError):
        return False
    return True


# -- the host's side -------------------------------------------------------------------------

def main(conn: Any) -> None:
    """The host process: load the backend, then answer requests until told to exit."""
    children.bound_to_parent()
    children.keep()  # (first: a PID namespace needs the capabilities confine drops)
    children.confine()
    name, recorded = conn.recv()
    allocator()
    from d500 import backends, threads
    backends.quiet_frameworks()
    try:
        cls = backends.get(name)
        fw = backends.framework(name)
        if recorded is not None:
            threads.configure(modules=[fw[0]] if fw else [],
                              fallback=(recorded["count"], recorded["set_by"]))
    except UsageError as err:
        serve_refusal(conn, str(err))
        return
    state: dict[str, Any] = {"cls": cls, "name": name, "exes": [], "timed": []}
    serve(conn, lambda message: _answer(state, message))


def _numpy(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): np.asarray(v) for k, v in value.items()}
    return [np.asarray(v) for v in value]


def _answer(state: dict[str, Any], message: tuple[Any, ...]) -> Any:
    from d500 import backends
    kind, cls = message[0], state["cls"]
    if kind == "facts":
        return {"name": state["name"], "framework": cls.framework,
                "trainable": bool(cls.trainable), "version": backends.version(state["name"])}
    if kind == "threads":  # what the backend's frameworks run with in this process
        from d500 import threads
        return threads.actual()
    if kind == "prepare":
        model = message[1]
        exe = cls.prepare(onnx.load_from_string(model) if isinstance(model, bytes) else model)
        state["exes"].append(exe)
        return {"id": len(state["exes"]) - 1, "settings": exe.settings(),
                "parameter_names": list(getattr(exe, "parameter_names", [])),
                **{k: getattr(exe, k, None) for k in ("precision", "compile_time",
                                                      "compile_cache", "baked_inputs")}}
    exe = state["exes"][message[1]] if kind in ("run", "gradients", "time") else None
    if kind == "run":
        return _numpy(exe.run(message[2]))
    if kind == "gradients":
        outs, grads = exe.gradients(message[2], output=message[3], wrt=message[4])
        return _numpy(outs), _numpy(grads)
    if kind == "time":  # a timed call, prepared as level 0 prepares a checked forward
        _, _, which, names, inputs, output, wrt, key, vocab = message
        timed = {"run": CallRunner(exe, which, names, output, wrt,
                                   None if vocab is None else int(vocab))}
        _prepare(timed, inputs, key)
        state["timed"].append(timed)
        return len(state["timed"]) - 1
    if kind == "call" and message[2] == "repeat":  # level 0's round trip: its checksums
        return operator_answer(None, state["timed"][message[1]], message[2:])
    raise D500Error(f"the backend host got an unknown request '{kind}'")
