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

The judge does not take the host's word for how many forward calls a round trip ran: each
round trip carries a seed the judge draws then, from which every call's first input is shifted
by its own amounts, and every call's outputs are weighed by their own weights. Call i adds to
element j of x the offset p[(j + r_i) % PATTERN], p a pattern of PATTERN = 65,521 numbers
uniform in [0, scale / 2) (scale: mean |x| at first; non-negative, so an input kept positive
for Log or Pow stays so), r_i a roll in [0, PATTERN): the offsets are a window of p stored
twice over, a slice, no work (tiled over an x of more elements). The host returns each call's
outputs as checksums, their dot product with float32 weights, one per element: the window at
the call's own t_i of an output's weight pattern w (element j weighed by w[(j + t_i) % M], M
its size or PATTERN if more, plus WEIGHTS_APART, so never PATTERN: where the two periods are
equal an elementwise linear operator's checksum is a function of r_i - t_i, found for all by
one correlation; a slice of w stored twice over). The pattern and the weights follow from a
key the judge sends when the timed call is prepared. After timing, the judge recomputes
SAMPLES calls drawn from all round trips with the reference (`Batched.verify`); a missing or
wrong one fails the run. To pass, a host must know every element of every call's output
(every weight is nonzero), every element's input changes from call to call, and elements
share an offset only PATTERN apart, so Softmax and the normalizations, which undo a uniform
shift along their axis, do not give one call's output for all (with one shift per call they
did; an axis whose stride PATTERN, a prime, divides is not checked).

Why each element its own offset and weight per call (benchmarks/shift_cheats.py,
tests/operators/test_shift_cheats.py): call i's offsets were s_i times one pattern of 1021
elements, rolled by r_i in [0, 1021) and tiled, and the weights one vector per timed call. An
operator file that replaces the host's loop (it runs in the host's process) then answered
calls without running them: a MatMul, linear in x, as w.(x B) + s_i C[r_i], C found once by
one matmul and a correlation of length 1021 (20,600x faster than honest, passed); a Relu,
whose elements j = c mod 1021 all got one offset, by binary searches in each class's elements
sorted once and prefix sums (2.5x faster, passed). Now a call's offsets are PATTERN
independent numbers at one of PATTERN rolls, and its weights a window of their own pattern (a
table of every call's checksum has PATTERN x M entries, 4.4e9 for a 256x256 output): both
cheats answer wrong and are caught. With the first input alone shifted, a MatMul's row of
x + u is a window of p, so a table of every window of p times B (PATTERN x N, one matmul of
PATTERN rows, once) gave (x + u) B by gathering rows, 6.8x faster than the matmul, and passed
(WindowMatMul there). So at level 0 a forward's second float input (`second_float`: a MatMul's
B, a Conv's W) is shifted too, by its window at its own roll (`_second_rolls`) of a pattern
of its own (stream SECOND, at its own mean |.|, never grown): (x + u)(B + v) has a term u v,
two windows' product, that only a matmul gives (a table of it would need a pair of rolls,
PATTERN^2 entries); it costs a pass over B a call. Level 1 (d500.networks.hosted) shifts its
first float input only.

Why calls differ element by element, and a bound of SIGMAS standard deviations: calls once
differed only by s_i, all
on one pattern, so two calls' checksums differed by about (s_i - s_k) C, C = sum_j w_j p_j
dy_j/dx_j one number per key, N(0, ~n/3); and a checksum was allowed rtol sum |w y| +
atol_frac max|y| sum |w|, the worst case, which grows like n. For relu-4d (n = 262,144) the
bound was 18.5 and 0.45 |C| fell under it for 1 key in 8: every copy passed, and a host that
ran 1 call in 10 was recorded with a tenth of its latency (the flake of
tests/operators/test_call_count.py; its failing runs had |C| = 26 and 3.7, the passing ones
78-368). Since 62acbeb two calls' offsets differ element by element (then a roll of the tiled
pattern, now a window of the whole one), so a copy's difference is a sum of
n independent terms, and the bound is statistical: an honest output's error e (|e_j| <= the
tolerance t_j) is the host's, drawn apart from the weights w ~ N(0, 1), so sum w_j e_j is
N(0, sum e_j^2): SIGMAS * ||t||_2 (a false failure 2e-9 a pick), plus the float32 dot's
rounding. Both grow like sqrt(n). And the check's power is a fact the judge measures, not
assumes: given the reference before timing (`checked_forward`, as `d500 op bench` does), it
recomputes PROBES calls and grows the scale (x GROWTH, at most GROWTHS times) until the bound
tells about POWER of their pairs apart (`_power`: two calls' checksums differ by a normal draw,
so a share of pairs always falls within the bound, the smaller the more the draw's spread
exceeds it); `verify` counts it again on its picks, the share of pairs of recomputed calls a
copy of one for the other would fail (`power`, recorded by the bench as `calls_told_apart`).
Each copy is caught with that probability q, a host skipping a share f of its calls with
1 - (1 - f q) ** SAMPLES. On level 0's cases (seed 0, with the tiled pattern's offsets, s_i
p, 0.14 of the scale on average, now 0.25): every float32 one 0.95-0.995 (the scale
grown x4 on 5 of them), so a host running one call in ten is caught with probability
1 - 1e-27 and one running 9 in 10 with 0.96; the bfloat16 ones (rtol 2^-5, atol 2^-6 of the
peak) 0.29 (MatMul) and 0.11 (Softmax) at best (x64): 1 in 10 caught with 1 - 6e-5 and 0.96,
9 in 10 with 0.61 and 0.30.

The backward's round trips are checked the same way (`checked_backward`, the Runner's
`shifted_backward`): call i of a round trip shifts the first float output gradient by its own
amounts, the host returns the float inputs' gradients as checksums, and the judge recomputes
SAMPLES calls with the reference's gradients (d500.operators.reference.reference_gradients),
at the gradients' tolerance (d500.tolerances.operator_gradient as rtol, a hundredth of it as
atol_frac; d500.operators.bench._gradient_tolerance). A
built-in row's backward (d500.operators.backward's hooks) pays the same shift and checksums in
the judge's process (d500.operators.bench.HookRunner), unverified as its forward is. Where the
reference cannot recompute a call (an operator it has no gradient of), no call is checked and
the record says why (`unverified`, the bench's `calls_unverified`).

A backward call's offsets and weights are each their window times a window of +1 and -1 at a
start of its own (`_signs`, `_flips`; `signed`, `flipped`). A backward is linear in the output
gradient, and its inputs, saved once, do not change from call to call (a graph recorded once
cannot take a shifted input without its forward run again): with the offsets a window of one
pattern, L(g + u) = L(g) + L(u) had L(u) in a table of every window (a MatMul's (g + u) B^T:
rows of windows times B^T), and with the weights a window, w.L(g') = L^T(w).g' had L^T(w) in
a table of every window, whatever the shift (tests/operators/ops/shift_cheats.py,
GradientWindowMatMul and GradientWeightsMatMul, passed, 3.4x and 6.5x faster than honest). A
row of a window times signs at a start of its own takes a value per pair of starts (PATTERN^2
for the shift; M^2 / ALIGN for the weights, whose turns start on ALIGN elements): neither
table can be made, and a call needs L(u) or L^T(w), the backward's own work (both now caught).
Signs keep the weights N(0, 1) (the bound holds) and are exact in every float type.

The shift and the checksum run in the operator's framework (its Runner's `shifted` and
`checksums`: NumPy's in-place add, also for torch's tensors, and einsum; torch.dot in torch's
threads; a jitted add and dot on JAX's device, the pattern and the weights put there once),
one pass over the first input and its window of the pattern, and one over the outputs and
their weights, per call. Built-in backends and operators imported by the judge run the same calls in
its process (`checked_forward`, `Local`), so every row of a comparison pays the check alike.
What the check costs against the unchecked loop (`benchmarks/call_check.py --rounds 15`,
2026-11-27 17:05-17:12, load 6.5-8.3 on 2 cores, median of 3 runs, wall; forward, backward):
Relu on 1 MiB, memory-bound, 2.4x, 2.6x in NumPy, 4.0x, 2.7x in torch, 7.0x, 4.5x in JAX; a
256x256 MatMul 1.12x, 1.17x in NumPy, 1.08x, 1.08x in torch (README; the forward, before the
roll: Relu 2.0x, 5.1x, 4.2x, MatMul 1.12x, 1.10x, load 6.4-8.8). With the windows, side by
side with the code before them (2026-11-27 23:22-23:41, load 5.0-11.5, README): the same within
the runs' spread, JAX's Relu less (3.7x, 3.6x against 4.6x, 4.6x: the pattern put on its
device once, `_OnDevice`), torch's backward more (Relu 3.0x against 2.8-2.9x, MatMul
1.19-1.29x against 1.06-1.16x).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from d500 import children, untrusted
from d500.errors import D500Error, UsageError

ROUND_TRIP = 0.05  # seconds of timed calls per round trip at least
OVERHEAD = 0.01  # the largest share of a round trip its own cost may take
# seconds of timed calls per round trip at most: a loaded machine's empty round trip (the
# slowest of five) read 50 ms, which OVERHEAD alone made 5 s round trips of checked calls, the
# per-call time under-read too: one `op bench --budget 0.05` row ran 11 minutes (load 13). A
# round trip's cost is then over OVERHEAD, and the row says so (empty_round_trip, its calls)
MAX_TRIP = 1.0
MAX_INNER = 100_000
START = 300.0  # seconds a host may take to answer (import the operator's file, the backend's
#               module; translate a model)
SAMPLES = 32  # calls the judge recomputes after timing: skipping 10 % of calls is caught
#               with probability 1 - (1 - 0.1 q) ** 32, 0.97 where each copy is (q = 1)
PATTERN = 65521  # the shift's pattern's length, a prime: its distinct windows, and how far apart
#                 two elements of a call that share an offset are (`_pattern`)
WEIGHTS_APART = 1021  # the weights' pattern is this much longer than the shift's (`_weights`)
CHECKSUM_SLACK = 1e-5  # a float32 dot product's rounding, relative to sum |w y|
SIGMAS = 6.0  # an honest checksum's error is refused with probability 2e-9 (`_expected`)
POWER = 0.95  # the share of pairs of calls whose checksums the bound should tell apart
GROWTH, GROWTHS = 4.0, 3  # the shift's scale grows by GROWTH at most GROWTHS times (`calibrate`)
SECOND = 5  # the stream of the second input's pattern (`_pattern`; its scale is never grown)
PROBES = 6  # calls recomputed to estimate the check's power before timing
SIGNS = 6  # the stream of a backward's sign patterns (`_signs`: its shift's, its weights')


class Raised(D500Error):
    """What a host runs (an operator, a backend) raised there: the message is its type, text and
    innermost frame."""


class Host:
    """The judge's handle on one host process, spawned to run `target` (level 0's `main`,
    d500.networks.hosted's), which is sent `first` and this process's thread setting; `what`
    ("operator", "backend") names what it runs in the errors."""

    def __init__(self, target: Callable[[Any], None], what: str, *first: Any):
        from d500 import threads
        self.what = what
        children.shield()
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child,), name=f"d500-{what}-host",
                                   daemon=True)
        children.start(self.process)  # ^C held till it ignores it
        child.close()
        self.conn.send((*first, threads.recorded()))

    def ask(self, *message: Any) -> Any:
        """Send one request, return its reply (what the host runs raised: Raised)."""
        try:
            self.conn.send(message)
            if not self.conn.poll(START):
                raise D500Error(f"the {self.what} host did not answer '{message[0]}' within "
                                f"{START:g} s")
            kind, value = untrusted.receive(self.conn)  # its pickles may call nothing here
        except (EOFError, OSError, BrokenPipeError):
            self.process.join(timeout=5)
            raise Raised(f"the {self.what}'s process ended (exit code "
                         f"{self.process.exitcode}) during '{message[0]}'") from None
        except (untrusted.Forbidden, TypeError, ValueError) as err:
            raise Raised(f"the {self.what}'s process answered '{message[0]}' with what d500 "
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
        host = Host(main, "operator", str(file), name)
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

    def timed_forward(self, inputs: list[np.ndarray], reference: Any = None,
                      tolerance: tuple[float, float] | None = None) -> Batched:
        from d500.operators.adapters import second_float
        key, second = secrets.randbits(63), second_float(inputs)  # the checksums' weights
        self.host.ask("prepare", "forward", inputs, None, key, second)
        return Batched(self.host, "forward", inputs, key, reference, tolerance, second=second)

    def timed_backward(self, inputs: list[np.ndarray], grads: list[np.ndarray | None],
                       reference: Any = None, tolerance: tuple[float, float] | None = None
                       ) -> Batched | None:
        key = secrets.randbits(63)
        if not self.host.ask("prepare", "backward", inputs, grads, key):
            return None
        return Batched(self.host, "backward", inputs, key, reference, tolerance, grads)


class Batched:
    """One timed call: a round trip in which the host runs the prepared call `inner` times,
    `inner` chosen so that the round trip's own cost (the slowest of a few empty round trips:
    a process's wake-up on a busy machine takes milliseconds) is under OVERHEAD of it, within
    MAX_TRIP s (past which the cost is over OVERHEAD: a loaded machine, as recorded). The
    calls are sized by the host's own reading of its time, which the judge uses for nothing
    else: a host that misreports it only makes its own round trips costlier or longer.
    Round trips given a key are checked call by call afterwards (`verify`): a forward's calls
    each shift its first input, a backward's its first float output gradient (`first_grad`)."""

    label: str | None = None  # what verify's failures call a timed call (None: its kind)
    host_name = "operator"  # what runs in the host (level 1's: "backend")
    second: int | None = None  # the input a forward's calls shift besides the first (level 0)

    def __init__(self, host: Host | Local, kind: str, inputs: list[np.ndarray] | None = None,
                 key: int | None = None, reference: Any = None,
                 tolerance: tuple[float, float] | None = None,
                 grads: list[np.ndarray | None] | None = None, second: int | None = None):
        from d500.operators.adapters import first_grad
        self.host, self.kind, self.key = host, kind, key
        self.inputs, self.grads = inputs, grads  # what the calls ran on
        self.first = 0 if grads is None else first_grad(grads)  # the array each call shifts
        self.checked = 0  # calls recomputed by `verify`
        self.power: float | None = None  # the share of pairs of calls the check told apart
        self.unverified: str | None = None  # why the reference could not recompute a call
        self._weights: list[np.ndarray] | None = None
        checked = inputs and key is not None and (kind == "forward" or self.first is not None)
        self.scale = self._scale_of(self._varied()) if checked else None
        self.second = second if self.scale is not None and kind == "forward" else None
        if self.second is not None:
            x = inputs[self.second]
            self._second = _pattern(key, _shift_scale(x), x.dtype, SECOND)
        if self.scale is not None and reference is not None and tolerance is not None:
            self.calibrate(reference, *tolerance)
        self.trips: list[tuple[int, int, np.ndarray]] = []  # (seed, calls, checksums)
        self._ask(1)  # a first call on a new array (jax: 0.3 s) would size the round trips
        self.overhead = max(self._round_trip(0) for _ in range(5))
        target = min(max(ROUND_TRIP, self.overhead / OVERHEAD), MAX_TRIP)
        calls = 1
        while True:
            inside = float(self._ask(calls)[0])
            if inside >= target / 8 or calls >= MAX_INNER:
                break
            calls = min(MAX_INNER, calls * 4)
        # the least of three readings at that count: one call preempted for 50 ms on a loaded
        # machine read as a whole round trip's worth, and left every round trip one call long
        inside = min(inside, *(float(self._ask(calls)[0]) for _ in range(2)))
        per_call = max(inside / calls, 1e-9)
        self.inner = max(1, min(MAX_INNER, math.ceil(target / per_call)))

    def _ask(self, calls: int) -> Any:
        seed = secrets.randbits(63)  # drawn now: the host cannot have computed these calls
        inside, sums = self.host.ask("repeat", self.kind, calls, seed, self.scale)
        if self.scale is not None:
            self.trips.append((seed, calls, sums))
        return inside, sums

    def _round_trip(self, calls: int) -> float:
        t = time.perf_counter()
        self._ask(calls)
        return time.perf_counter() - t

    def __call__(self) -> None:
        self._ask(self.inner)

    def verify(self, reference: Any, rtol: float, atol_frac: float, samples: int = SAMPLES,
               rng: Any = None) -> str | None:
        """Recompute `samples` of the calls the host ran, drawn from all its round trips, with
        `reference` (a forward's: NumPy inputs -> outputs; a backward's: (inputs, output
        gradients) -> the float inputs' gradients); what is wrong, or None."""
        if self.scale is None:
            return None
        rng = rng or np.random.default_rng(secrets.randbits(63))
        for t, (seed, calls, sums) in enumerate(self.trips):
            try:
                sums = np.asarray(sums, dtype=np.float64)
            except (TypeError, ValueError):
                return (f"the {self.host_name}'s host answered round trip {t} with no "
                        f"checksums")
            answered = len(sums) if sums.ndim == 2 else 0
            if answered != calls:
                return (f"the {self.host_name}'s host answered {answered} of the {calls} timed "
                        f"calls of round trip {t}: the host did not run every call it was "
                        f"timed for")
            self.trips[t] = (seed, calls, sums)
        counts = np.array([calls for _, calls, _ in self.trips], dtype=np.int64)
        if counts.sum() == 0:
            return None
        picks = rng.choice(int(counts.sum()), size=min(samples, int(counts.sum())),
                           replace=False)
        starts = np.cumsum(counts) - counts
        expected = []  # (checksums, bounds) of each pick, as the reference gives them
        for pick in picks:
            t = int(np.searchsorted(starts, pick, side="right") - 1)
            seed, calls, sums = self.trips[t]
            i = int(pick - starts[t])
            rolls, turns = _rolls(seed, calls)
            flips = _flips(seed, calls)
            try:
                want, bounds = self._reference_sums(reference, rolls[i], turns[i], rtol,
                                                    atol_frac, _second_rolls(seed, calls)[i],
                                                    (flips[0][i], flips[1][i]))
            except D500Error as err:  # the reference cannot recompute a call: none checked
                self.unverified = str(err)
                return None
            expected.append((want, bounds))
            for k, (e, b) in enumerate(zip(want, bounds)):
                if k >= sums.shape[1] or not _agrees(float(sums[i][k]), e, b):
                    what = "output" if self.kind == "forward" else "input gradient"
                    return (f"timed {self.label or self.kind} call {i} of round trip {t} did "
                            f"not return the reference's {what} {k} for its input: the host "
                            f"did not run every call it was timed for")
        self.checked = len(picks)
        power = _power(expected)
        self.power = power if power is not None else self.power
        return None

    def calibrate(self, reference: Any, rtol: float, atol_frac: float) -> None:
        """Before timing: grow the shifts' scale until the bound tells apart the reference's
        checksums of PROBES calls, pair by pair, with probability POWER (`_power`); at most
        GROWTHS times, else the scale that told most apart."""
        assert self.scale is not None
        rng = np.random.default_rng(secrets.randbits(63))
        tried = []
        for _ in range(GROWTHS + 1):
            seed = int(rng.integers(2 ** 62))
            rolls, turns = _rolls(seed, PROBES)
            try:
                power = _power([self._reference_sums(reference, r, t, rtol, atol_frac, r2,
                                                     (f, f2))
                                for r, t, r2, f, f2 in zip(rolls, turns,
                                                           _second_rolls(seed, PROBES),
                                                           *_flips(seed, PROBES))],
                               model=True)
            except D500Error as err:  # e.g. no reference gradient of this operator: `verify`
                self.unverified = str(err)  # will say so
                return
            if power is None or power >= POWER:
                self.power = power
                return
            tried.append((power, -self.scale))
            self.scale *= GROWTH
        self.power, scale = max(tried)
        self.scale = -scale

    def _reference_sums(self, reference: Any, roll: int, turn: int, rtol: float,
                        atol_frac: float, roll2: int = 0, flips: tuple[int, int] = (0, 0)
                        ) -> tuple[list[float], list[float]]:
        """The checksums of one call's outputs as the reference gives them (the call's roll of
        the shift's pattern, of the second input's with `second`, and turn of the weights; a
        backward's also its `flips`, where its shift's and its weights' signs start), and
        their bounds."""
        x = self._varied()
        backward = self.kind == "backward"
        if getattr(self, "_windows", (None,))[0] != self.scale:  # the pattern at this scale
            self._windows = (self.scale, _pattern(self.key, self.scale, x.dtype))
        offsets = _offsets(self._windows[1], roll, x.size)
        if backward:
            if getattr(self, "_shift_signs", None) is None:
                self._shift_signs = _signs(self.key, [PATTERN], x.dtype)[0]
            offsets = offsets * _offsets(self._shift_signs, flips[0], offsets.size)
        shifted = _shifted(x, offsets)
        if self.kind == "forward":
            arrays = [shifted, *self.inputs[1:]]
            if self.second is not None:
                y = self.inputs[self.second]
                arrays[self.second] = _shifted(y, _offsets(self._second, roll2, y.size))
            want = reference(arrays)
        else:
            grads = list(self.grads)
            grads[self.first] = shifted
            want = reference(self.inputs, grads)
        if getattr(self, "_weights", None) is None:
            self._weights = _weights(self.key, want)
            self._weight_signs = _weight_signs(self.key, want) if backward else None
        from d500.operators.adapters import flipped
        pairs = [_expected(_turned(w, turn, np.size(y)) if not backward else flipped(
                     _turned(w, turn, np.size(y)), s, flips[1]), y, rtol, atol_frac)
                 for w, y, s in zip(self._weights, want, self._weight_signs or self._weights)]
        return [e for e, _ in pairs], [b for _, b in pairs]


    def _varied(self) -> np.ndarray:
        """The array each call shifts."""
        return self.inputs[0] if self.kind == "forward" else np.asarray(self.grads[self.first])

    def _scale_of(self, x: np.ndarray) -> float | None:
        """The shift's first scale for the array each call shifts (None: calls unchecked);
        level 1 shifts token ids too (d500.networks.hosted.CheckedCall)."""
        return _shift_scale(x)


class Local:
    """A host's answers given in this process, to a Runner of d500's own (a built-in backend's
    executable) or of an operator imported here: the same checked calls, without the pipe."""

    def __init__(self, run: Any):
        self.state: dict[str, Any] = {"run": run}

    def ask(self, *message: Any) -> Any:
        return _answer(None, self.state, message)


def checked_forward(run: Any, inputs: list[np.ndarray], reference: Any = None,
                    tolerance: tuple[float, float] | None = None) -> Batched:
    """The forward of `run` timed as checked round trips: in its host for an operator there
    (RemoteRunner), else in this process, so that every row of a comparison pays the same.
    With the reference and the forward's (rtol, atol_frac), the shifts are sized first so that
    the check can tell calls apart (`Batched.calibrate`)."""
    if isinstance(run, RemoteRunner):
        return run.timed_forward(inputs, reference, tolerance)
    from d500.operators.adapters import second_float
    key, second = secrets.randbits(63), second_float(inputs)
    local = Local(run)
    local.ask("prepare", "forward", inputs, None, key, second)
    return Batched(local, "forward", inputs, key, reference, tolerance, second=second)


def checked_backward(run: Any, inputs: list[np.ndarray], grads: list[np.ndarray | None],
                     reference: Any = None, tolerance: tuple[float, float] | None = None
                     ) -> Batched | None:
    """The backward of `run` timed as checked round trips, as `checked_forward` times the
    forward (each call's first float output gradient shifted, its input gradients
    checksummed); None without a backward."""
    if isinstance(run, RemoteRunner):
        return run.timed_backward(inputs, grads, reference, tolerance)
    key = secrets.randbits(63)
    local = Local(run)
    if not local.ask("prepare", "backward", inputs, grads, key):
        return None
    kept = [None if g is None else np.array(g, copy=True) for g in grads]  # as sent
    return Batched(local, "backward", inputs, key, reference, tolerance, kept)


def _shift_scale(x: np.ndarray) -> float | None:
    """How far a call's first input is shifted (None: not a float input, calls unchecked)."""
    from d500.operators.dtypes import is_float
    if not is_float(x.dtype) or x.size == 0:
        return None
    return float(np.mean(np.abs(x.astype(np.float64)))) or 1.0


def _rolls(seed: int, calls: int) -> tuple[np.ndarray, np.ndarray]:
    """Each call's roll r_i of the shift's pattern (`_pattern`) and turn t_i of the weights
    (`_turned`), each from its own stream: the first m calls' draws do not depend on how many
    calls there are."""
    return (np.random.default_rng([seed, 3]).integers(0, PATTERN, calls),
            np.random.default_rng([seed, 4]).integers(0, 2 ** 62, calls))


def _second_rolls(seed: int, calls: int) -> np.ndarray:
    """Each call's roll of the second input's pattern (`SECOND`), from a stream of its own."""
    return np.random.default_rng([seed, 5]).integers(0, PATTERN, calls)


def _flips(seed: int, calls: int) -> tuple[np.ndarray, np.ndarray]:
    """A backward call's starts in its sign patterns (`_signs`): of its shift's, in
    [0, PATTERN), and of its weights' (`flipped`: taken mod their length, never aligned), each
    from its own stream."""
    return (np.random.default_rng([seed, 6]).integers(0, PATTERN, calls),
            np.random.default_rng([seed, 7]).integers(0, 2 ** 62, calls))


def _signs(key: int, sizes: list[int], dtype: Any = np.float32, stream: int = 0
           ) -> list[np.ndarray]:
    """Patterns of +1 and -1 (one of each length in `sizes`, in `dtype`), each twice over: a
    backward call multiplies its shift's window of the pattern by a window of the first at its
    own start (`_flips`), and its weights' window by one of their own (`_weight_signs`). The
    product of two windows at independent starts takes PATTERN^2 values: a table of what a
    linear backward makes of every one cannot be made (README: GradientWindowMatMul)."""
    rng = np.random.default_rng([key, SIGNS, stream])
    return [np.tile((rng.integers(0, 2, n, dtype=np.int8) * 2 - 1).astype(dtype), 2)
            for n in sizes]


def _weight_signs(key: int, outputs: list[Any]) -> list[np.ndarray]:
    """A backward's weights' sign patterns, one per output, as long as its weights' pattern
    (`_weights`, M): w_j s_j is N(0, 1) as w_j is, so the bound (`_expected`) holds."""
    return _signs(key, [max(int(np.prod(np.shape(y))), PATTERN) + WEIGHTS_APART
                        for y in outputs], np.float32, 1)


def _pattern(key: int, scale: float, dtype: Any, stream: int = 2) -> np.ndarray:
    """What a call's offsets are windows of: element j of call i is shifted by
    p[(j + r_i) % PATTERN], p uniform in [0, scale / 2) (non-negative: an input kept positive
    for Log or Pow stays so): an element's offset changes from call to call, along every axis
    (Softmax and the normalizations undo a shift uniform along theirs; but along one whose
    stride PATTERN, a prime, divides), and two elements of a call share one only PATTERN
    apart. Returned twice over, in the input's dtype, so that a call's offsets are a slice
    (`_offsets`): no work."""
    p = (np.random.default_rng([key, stream]).uniform(0.0, 0.5, PATTERN) * scale).astype(dtype)
    return np.concatenate([p, p])


def _offsets(pattern: np.ndarray, roll: int, size: int) -> np.ndarray:
    """A call's offsets for an array of `size` elements: the window of the pattern at its
    roll, as long as the array or PATTERN (then tiled over it, `_shifted`: in cache)."""
    return pattern[int(roll):int(roll) + min(int(size), PATTERN)]


def _turned(w: np.ndarray, turn: int, size: int) -> np.ndarray:
    """One call's weights of an output of `size` elements: the window of its weights (M of
    them, given twice over by `_weights`) at t_i mod M, a slice."""
    from d500.operators.adapters import turned
    start = turned(w.size, size, turn)
    return w[start:start + size]


def _shifted(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    from d500.operators.adapters import add_tiled
    flat = np.ascontiguousarray(x).reshape(-1)
    return add_tiled(flat, offsets, np.empty_like(flat)).reshape(x.shape)


def _weights(key: int, outputs: list[Any]) -> list[np.ndarray]:
    """Each output's weights (native arrays: only their shapes): M float32 N(0, 1) draws, M its
    size or PATTERN if more, plus WEIGHTS_APART, twice over: call i dots an output with
    their window at its own t_i (`_turned`), so that a call's checksum weighs each element
    anew. M is never the shift's pattern's length: an elementwise linear operator's checksum
    would otherwise be a function of r_i - t_i, one correlation found once."""
    rng = np.random.default_rng([key, 1])
    return [np.tile(rng.standard_normal(max(int(np.prod(np.shape(y))), PATTERN) + WEIGHTS_APART,
                                        dtype=np.float32), 2) for y in outputs]


def _expected(w: np.ndarray, want: Any, rtol: float, atol_frac: float) -> tuple[float, float]:
    """The checksum of the reference's output `want` and how far an honest one may be from it:
    SIGMAS standard deviations of sum w_j e_j, where e_j, the output's error, is within the
    tolerance t_j = rtol |y_j| + atol_frac max |y|: w is drawn from N(0, 1) apart from e, so
    sum w_j e_j is N(0, sum e_j^2) at most N(0, sum t_j^2); plus the float32 dot's rounding."""
    y = np.asarray(want).astype(np.float64).ravel()
    w64 = w.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = float(np.dot(w64, y))
    if not math.isfinite(expected):
        return expected, 0.0
    peak = float(np.max(np.abs(y), initial=0.0)) or 1.0
    spread = math.sqrt(float(np.sum(np.square(rtol * np.abs(y) + atol_frac * peak))))
    return expected, SIGMAS * spread + CHECKSUM_SLACK * float(np.dot(np.abs(w64), np.abs(y)))


def _agrees(got: float, expected: float, bound: float) -> bool:
    if not math.isfinite(expected):
        return math.isnan(got) if math.isnan(expected) else got == expected
    return abs(got - expected) <= bound


def _power(expected: list[tuple[list[float], list[float]]], model: bool = False
           ) -> float | None:
    """The share of pairs of these calls (each its checksums and bounds) that a host answering
    one with the other's checksums fails: some output's checksums differ by more than both
    bounds. A pair's difference is about normal, mean 0: with `model`, the share that
    N(0, their mean square) leaves past the mean bound, per output, from a few calls (15
    pairs of 6 give it closer than counting them). None: fewer than two calls, or none with
    finite checksums."""
    told, pairs, gaps = 0, 0, []
    for a in range(len(expected)):
        for b in range(a):
            (ea, ba), (eb, bb) = expected[a], expected[b]
            if not all(map(math.isfinite, [*ea, *eb])):
                continue
            pairs += 1
            told += any(abs(x - y) > u + v for x, y, u, v in zip(ea, eb, ba, bb))
            gaps.append([(x - y, u + v) for x, y, u, v in zip(ea, eb, ba, bb)])
    if not pairs:
        return None
    if not model:
        return told / pairs
    missed = 1.0
    for k in range(len(gaps[0])):
        spread = math.sqrt(sum(g[k][0] ** 2 for g in gaps) / pairs)
        bound = sum(g[k][1] for g in gaps) / pairs
        missed *= math.erf(bound / (spread * math.sqrt(2))) if spread > 0 else 1.0
    return 1.0 - missed


def main(conn: Any) -> None:
    """The host process: import the file, then answer requests until told to exit."""
    children.bound_to_parent()
    file, name, recorded = conn.recv()  # (first: the file's folder stays seen by the split)
    children.keep(shown=[os.path.dirname(os.path.abspath(file))])
    children.confine()  # (keep first: a PID namespace needs the capabilities confine drops)
    from d500.heap import allocator
    allocator()  # the judge's heap (d500.operators.bench.bench sets it before timing)
    try:
        cls = _load(Path(file), name, recorded)
    except UsageError as err:
        serve_refusal(conn, str(err))
        return
    state: dict[str, Any] = {}
    serve(conn, lambda message: _answer(cls, state, message))


def serve(conn: Any, answer: Callable[[tuple[Any, ...]], Any]) -> None:
    """In a host: answer each request (`answer(message)`; what it raised, as one line) until
    told to exit or the judge is gone."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "exit":
            return
        try:
            conn.send(("ok", answer(message)))
        except Exception as err:  # noqa: BLE001 - the hosted code's failure, as one line
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


def serve_refusal(conn: Any, text: str) -> None:
    """In a host: answer the first request with the UsageError of its start (the file, the
    backend not loaded)."""
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
    if kind == "heap":  # whether glibc mmaps a block of each size here (d500.heap.probe)
        from d500.heap import probe
        return probe()
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
        _, which, inputs, grads, *key = message
        if key and which == "forward":
            second = key[1] if len(key) > 1 else None  # level 0's: the input also shifted
            shifted = run.shifted(inputs, second)
            state["checked " + which] = {
                "apply": lambda offsets, more=None: run.call(shifted(offsets, more)),
                "key": key[0], "dtype": inputs[0].dtype, "size": np.size(inputs[0]),
                "second": None if second is None else _pattern(
                    key[0], _shift_scale(inputs[second]), inputs[second].dtype, SECOND),
                "second size": None if second is None else np.size(inputs[second])}
        elif key:
            from d500.operators.adapters import first_grad
            apply = run.shifted_backward(inputs, grads)
            if apply is None:
                return False
            varied = np.asarray(grads[first_grad(grads)])
            state["checked " + which] = {
                "apply": apply, "key": key[0], "dtype": varied.dtype, "size": varied.size,
                "signs": _signs(key[0], [PATTERN], varied.dtype)[0]}
            return True
        call = run.timed_forward(inputs) if which == "forward" else run.timed_backward(inputs,
                                                                                       grads)
        state[which] = call
        return call is not None
    if kind == "repeat":  # replies with the host's own reading, which the judge never uses
        _, which, calls, seed, scale = message
        t = time.perf_counter()
        sums = None
        if scale is None:
            call = state[which]
            for _ in range(calls):
                call()
        else:
            sums = _checked_calls(run, state["checked " + which], calls, seed, scale)
        return time.perf_counter() - t, sums
    raise D500Error(f"the operator host got an unknown request '{kind}'")


def _checked_calls(run: Any, checked: dict[str, Any], calls: int, seed: int, scale: float
                   ) -> np.ndarray:
    """Run the prepared call `calls` times, call i on its array (the forward's first input, the
    backward's first float output gradient) shifted by its own amounts, and return each call's
    results' checksums (calls x results), both done by the framework's own kernels (the
    Runner's `shifted` or `shifted_backward`, and `checksums`)."""
    from d500.operators.adapters import as_tuple
    size = checked["size"]
    if checked.get("scale") != scale:  # the pattern: once per timed call and scale
        checked["scale"] = scale
        checked["pattern"] = _pattern(checked["key"], scale, checked["dtype"])
    pattern = checked["pattern"]
    rolls, turns = _rolls(seed, calls)
    second = checked.get("second")
    rolls2 = _second_rolls(seed, calls) if second is not None else None
    signs = checked.get("signs")  # a backward's: its shift and weights times a sign window
    flips = _flips(seed, calls) if signs is not None else (turns, None)
    sums = np.empty((calls, 0))
    for i in range(calls):
        offsets = _offsets(pattern, rolls[i], size)
        if signs is not None:
            outs = as_tuple(checked["apply"](offsets, signs=_offsets(signs, flips[0][i], size)))
        else:
            outs = as_tuple(checked["apply"](offsets) if second is None else checked["apply"](
                offsets, _offsets(second, rolls2[i], checked["second size"])))
        if checked.get("checksums") is None:  # the weights: once per timed call, from its key
            key = checked["key"]
            checked["checksums"] = run.checksums(_weights(key, outs)) if signs is None else \
                run.checksums(_weights(key, outs), _weight_signs(key, outs))
        row = (checked["checksums"](outs, int(turns[i])) if signs is None else
               checked["checksums"](outs, int(turns[i]), int(flips[1][i])))
        if i == 0:
            sums = np.empty((calls, len(row)))
        sums[i] = row
    return sums
