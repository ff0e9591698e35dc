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

What the judge checks of a round trip: its last call runs on feeds the judge shifts by amounts
drawn from a seed it sends with the round trip (the first float input, x + s u with s in
[0.05, 0.5] of mean |x| and u uniform in [0, 1) per element), and that call's outputs (a
training step's outputs and gradients) come back; after timing the judge recomputes CHECKED of
the round trips' last calls with the reference backend and compares them at
d500.networks.compare's tolerance (`HostedCall.verify`). So a host cannot answer from a cache,
and must run each round trip's last call (the reference's recomputation costs a few seconds
per timed call on the larger models: light-resnet50 at batch 1, 2.9 s a call). Open: the calls
before it are not checked, so a host that skips them (runs 1 call of `inner`) is timed as
`inner` times faster; level 0 checks every call with shifted inputs and checksums, level 1 does
not yet (README). Doing so would cost each call a perturbed input and a checksum of its outputs
(a training step's: of every gradient), a few microseconds, several % of a small model's
100-200 us call, which the in-process rows would then have to pay alike.

Built-in backends (d500's own code) stay in the judge's process and pay no round trip; what a
hosted row pays more is measured by benchmarks/hosted_backend.py: at load 8 on 2 cores,
1.7-2.6 % of a round trip outside the host's reading, median ratios 0.995-1.029 (README).
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
from d500.errors import D500Error, UsageError
from d500.heap import allocator
from d500.operators.host import MAX_INNER, Batched, Host, serve, serve_refusal

CHECKED = 3  # round trips whose last call the judge recomputes with the reference

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
        sent = str(model) if not isinstance(model, onnx.ModelProto) else model.SerializeToString()
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
              wrt: list[str] | None = None, trip: float = 0.0) -> HostedCall:
        """The timed call `kind` ("forward": run; "step": gradients) as round trips, each at
        least `trip` seconds long."""
        call = int(self.host.ask("time", self.id, kind, feeds, output, wrt))
        timed = HostedCall(self.host, kind, call, feeds, output, wrt, trip)
        timed.precision = getattr(self, "precision", None)  # as its agreement is judged
        return timed


class HostedCall(Batched):
    """One timed call of a hosted backend: a round trip runs it `inner` times (level 0's
    sizing), its last call on feeds shifted by the round trip's seed; those outputs are kept
    for `verify`."""

    def __init__(self, host: Host, kind: str, call: int, feeds: dict[str, np.ndarray],
                 output: str | None, wrt: list[str] | None, trip: float = 0.0):
        self.call, self.feeds, self.output, self.wrt = call, feeds, output, wrt
        self.lasts: list[tuple[int, Any]] = []  # (seed, the last call's outputs)
        self.outside: list[float] = []  # each round trip's share outside the host's reading
        self.precision: str | None = None  # a lower precision it computes in (its word)
        super().__init__(host, kind)
        if trip > 0:  # longer round trips: a woken host's delay is a smaller share of each
            per_call = max(float(self._ask(self.inner)[0]) / self.inner, 1e-9)
            self.inner = min(MAX_INNER, max(self.inner, math.ceil(trip / per_call)))
        self.outside.clear()

    def _ask(self, calls: int) -> Any:
        seed = secrets.randbits(63)  # drawn now: the host cannot have computed this call
        t = time.perf_counter()
        inside, last = self.host.ask("repeat", self.call, calls, seed)
        took = time.perf_counter() - t
        if calls:
            self.lasts.append((seed, last))
            if isinstance(inside, float) and took > 0:  # the host's word: a diagnostic only
                self.outside.append(max(0.0, 1.0 - inside / took))
        return inside, last

    def verify(self, reference: Any, samples: int = CHECKED) -> str | None:
        """Recompute the last call of `samples` round trips (the final one among them) with
        `reference` (the reference backend's executable of the same model); what is wrong, or
        None."""
        from d500.errors import describe
        from d500.networks.compare import compare
        if not self.lasts:
            return None
        rng = np.random.default_rng(secrets.randbits(63))
        picks = {len(self.lasts) - 1, *rng.choice(len(self.lasts),
                                                  min(samples, len(self.lasts)) - 1,
                                                  replace=False).tolist()}
        for t in sorted(picks):
            seed, got = self.lasts[t]
            feeds = shifted(self.feeds, seed)
            if self.kind == "forward":
                want, got_list = reference.run(feeds), got
            else:
                outs, grads = reference.gradients(feeds, output=self.output, wrt=self.wrt)
                want = [*outs, *(grads[k] for k in sorted(grads))]
                try:
                    g_outs, g_grads = got
                    got_list = [*g_outs, *(g_grads[k] for k in sorted(grads))]
                except (TypeError, ValueError, KeyError):
                    got_list = []
            if not isinstance(got_list, list | tuple) or len(got_list) != len(want):
                return (f"round trip {t}'s last timed call returned no outputs of the judge's "
                        f"input: the host did not run the call it was timed for")
            for k, (g, w) in enumerate(zip(got_list, want)):
                try:  # what the host sent: whatever it is, an error here is its failure
                    c = compare(f"{k}", np.asarray(g), np.asarray(w), precision=self.precision)
                except Exception as err:  # noqa: BLE001 - named in the failure
                    return (f"round trip {t}'s last timed call returned output {k} that d500 "
                            f"cannot compare with the reference's ({describe(err)})")
                if not c.ok:
                    return (f"round trip {t}'s last timed call did not return the reference's "
                            f"output {k} for the judge's input (max rel error {c.max_rel:.3g}): "
                            f"the host did not run the call it was timed for")
        self.checked = len(picks)
        return None


def _float_dtype(name: Any) -> bool:
    """Whether `name` is a precision d500.networks.compare can judge at (a dtype's name)."""
    from d500.networks.compare import rtol_for
    if not isinstance(name, str):
        return False
    try:
        rtol_for(np.dtype(np.float32), name)
    except (TypeError, ValueError, KeyError):
        return False
    return True


def shifted(feeds: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """`feeds` with its first float input shifted by the amounts `seed` gives (module doc)."""
    out = dict(feeds)
    for name, x in feeds.items():
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating) and x.size:
            rng = np.random.default_rng([seed, 5])
            scale = float(np.mean(np.abs(x.astype(np.float64)))) or 1.0
            s = rng.uniform(0.05, 0.5) * scale
            out[name] = (x + s * rng.uniform(0.0, 1.0, x.shape)).astype(x.dtype)
            break
    return out


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
    if kind == "time":
        _, _, which, feeds, output, wrt = message
        if which == "forward":
            state["timed"].append((which, (lambda f: exe.run(f)), feeds))
        else:
            state["timed"].append((which, lambda f: exe.gradients(f, output=output, wrt=wrt),
                                   feeds))
        return len(state["timed"]) - 1
    if kind == "repeat":  # replies with the host's own reading, which the judge never uses
        _, timed, calls, seed = message
        which, call, feeds = state["timed"][timed]
        t = time.perf_counter()
        for _ in range(calls - 1):
            call(feeds)
        last = call(shifted(feeds, seed)) if calls else None
        inside = time.perf_counter() - t
        if last is None:
            return inside, None
        if which == "forward":
            return inside, _numpy(last)
        return inside, (_numpy(last[0]), _numpy(last[1]))
    raise D500Error(f"the backend host got an unknown request '{kind}'")
