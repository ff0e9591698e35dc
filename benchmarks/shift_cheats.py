"""Whether level 0's call check stops an operator written against the shift's structure, and
what such a cheat gains: the cheats of tests/operators/ops/shift_cheats.py (a MatMul answering
each call's checksum from a cached output, a Relu from prefix sums) timed beside their honest
twins through the judge's checked round trips (d500.operators.host), interleaved round trip by
round trip, then verified as `d500 op bench` verifies them.

Per pair it prints the median per-call wall time of each (round trip / calls), their ratio, and
what `verify` says of each. Cases: Relu on relu-4d's 8x32x32x32 float32 and a 256x256 float32
MatMul, in NumPy. WindowMatMul is written against the shift of the first input only (it passed
until the second float input was shifted too, README); GradientWindowMatMul and
GradientWeightsMatMul, timed on the backward, against a backward's shift and weights when each
was a window of one pattern (they passed until each window was multiplied by a window of signs
at a start of its own, README).

    .venv/bin/python benchmarks/shift_cheats.py [--rounds 10] [--cheats PrefixRelu,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from d500 import tolerances
from d500.operators.host import RemoteClass

CHEATS = Path(__file__).resolve().parents[1] / "tests" / "operators" / "ops" / "shift_cheats.py"


def pair(cheat: str, honest: str, inputs: list[np.ndarray], reference, rounds: int,
         backward=None) -> None:
    rtol, atol = tolerances.operator_forward(np.dtype(np.float32))
    classes = {name: RemoteClass.start(CHEATS, name) for name in (cheat, honest)}
    try:
        if backward:  # the backward's calls, on the output gradient g
            g = [np.random.default_rng(1).standard_normal(reference(inputs)[0].shape)
                 .astype(np.float32)]
            rtol = tolerances.operator_gradient(np.dtype(np.float32))
            atol = rtol / 100  # as d500.operators.bench._gradient_tolerance

            def reference(arrays, grads):
                return backward(arrays, grads[0])
            timed = {name: cls().runner().timed_backward(inputs, g, reference, (rtol, atol))
                     for name, cls in classes.items()}
        else:
            timed = {name: cls().runner().timed_forward(inputs, reference, (rtol, atol))
                     for name, cls in classes.items()}
        wall: dict[str, list[float]] = {name: [] for name in timed}
        for r in range(rounds):
            for name in list(timed)[:: 1 if r % 2 else -1]:
                t0 = time.perf_counter()
                timed[name]()
                wall[name].append((time.perf_counter() - t0) / timed[name].inner)
        med = {name: statistics.median(v) for name, v in wall.items()}
        print(f"{cheat:13} {med[cheat] * 1e6:10.3f} us a call ({timed[cheat].inner} a round "
              f"trip); {honest} {med[honest] * 1e6:.3f} us: honest / cheat "
              f"{med[honest] / med[cheat]:.1f}x")
        for name, fn in timed.items():
            print(f"{'':13} {name}: {fn.verify(reference, rtol, atol) or 'passed the check'}")
    finally:
        for cls in classes.values():
            cls.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cheats", default="PrefixRelu,CachedMatMul,WindowMatMul,"
                        "GradientWindowMatMul,GradientWeightsMatMul", help="which")
    args = parser.parse_args()
    from d500 import threads
    threads.configure(modules=["numpy"])  # as `d500 op bench`: usable cores
    print("load:", os.getloadavg(), "threads:", threads.recorded())
    rng = np.random.default_rng(0)
    relu = [rng.standard_normal((8, 32, 32, 32)).astype(np.float32)]
    mm = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)]
    pairs = {"PrefixRelu": ("HonestRelu", relu, lambda a: [np.maximum(a[0], 0)]),
             "CachedMatMul": ("HonestMatMul", mm, lambda a: [a[0] @ a[1]]),
             "WindowMatMul": ("HonestMatMul", mm, lambda a: [a[0] @ a[1]]),
             "GradientWindowMatMul": ("HonestGradMatMul", mm, lambda a: [a[0] @ a[1]]),
             "GradientWeightsMatMul": ("HonestGradMatMul", mm, lambda a: [a[0] @ a[1]])}
    for cheat in args.cheats.split(","):
        honest, inputs, reference = pairs[cheat]
        pair(cheat, honest, inputs, reference, args.rounds,
             (lambda a, g: [g @ a[1].T, a[0].T @ g]) if cheat.startswith("Gradient") else None)
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
