"""What a call's checksums cost read in each output's memory order (d500.operators.adapters.weighed,
as Runner.checksums computes them now) beside the same checksums with each output copied to C
order first (as it did before): the reference backend's outputs of a training step of mlp-mnist
at batch 64 (level 1: its Gemm weight gradients are transposed views), and two C-ordered
level-0 outputs (relu-4d's 8x32x32x32, a 256x256 MatMul's), whose path did not change. The two
run interleaved call by call in one process, 1 thread; it prints the median time of each and the
median of the per-pair ratios.

    .venv/bin/python benchmarks/checksum_order.py [--calls 400]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from d500 import threads
from d500.operators.adapters import Runner, turned
from d500.operators.host import _weights


def copied(weights: list[np.ndarray]) -> Any:
    """The checksums as computed before: each output raveled to C order (a copy when it is not
    in C order), then einsum's dot."""
    def sums(outputs: list[Any], turn: int = 0) -> list[float]:
        out = []
        for w, y in zip(weights, outputs):
            y = np.asarray(y).ravel().astype(np.float32, copy=False)
            start = turned(w.size, y.size, turn)
            out.append(float(np.einsum("i,i->", w[start:start + y.size], y)))
        return out
    return sums


def step_outputs() -> list[Any]:
    from d500.backends import get
    from d500.networks import bench, workloads
    from d500.networks.hosted import CallRunner, _ordered
    wl = workloads.load(workloads.find("mlp-mnist"))
    model, path = wl.onnx_model()
    train_model, train_path = bench.training_model(wl, model, path)
    exe = get("reference").prepare(str(train_path))
    names, inputs, _ = _ordered(bench.training_inputs(wl, train_model))
    return CallRunner(exe, "step", names, wl.loss_output, list(exe.parameter_names)).call(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    threads.configure(1, ["numpy"])
    rng = np.random.default_rng(0)
    cases = {"mlp-mnist step, batch 64 (level 1)": step_outputs(),
             "Relu 8x32x32x32 (level 0)": [rng.standard_normal((8, 32, 32, 32), np.float32)],
             "MatMul 256x256 (level 0)": [rng.standard_normal((256, 256), np.float32)]}
    for label, outs in cases.items():
        weights = _weights(1, outs)
        before, after = copied(weights), Runner.__new__(Runner).checksums(weights)
        assert np.allclose(before(outs, 5), after(outs, 5), rtol=1e-4, atol=1e-2)
        tb, ta = [], []
        for i in range(args.calls):
            pair = ((before, tb), (after, ta))
            for fn, ts in (pair if i % 2 else pair[::-1]):
                t = time.perf_counter()
                fn(outs, i * 977)
                ts.append(time.perf_counter() - t)
        ratio = statistics.median(a / b for a, b in zip(ta, tb))
        print(f"{label:<36} copied to C order {statistics.median(tb) * 1e6:7.1f} us   "
              f"in memory order {statistics.median(ta) * 1e6:7.1f} us   ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
