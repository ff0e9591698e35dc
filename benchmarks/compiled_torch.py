"""torch eager, torch:compiled and onnxruntime on one network, side by side, interleaved.

A fourth contender, "torch fx", is torch:compiled's static fx program run uncompiled (eager
kernels, no graph walker): what the static translation alone gives eager torch. A fifth,
"compiled py", is torch:compiled with Inductor's Python wrapper, where a long program (light
ResNet-50) gets its C++ one (compiled.CPP_WRAPPER_FROM): what that choice gives.

Each backend prepares the workload's model (light ResNet-50 by default: random weights, batch 1)
and is timed on the same input in rounds whose order rotates, so that a burst of load from other
processes hits every backend alike. It prints the compile time of torch:compiled's first call
(Inductor's cache under $D500_HOME makes a second process faster: run it twice to see both),
then each backend's median latency and the median of the per-round ratios to onnxruntime, with
their quartiles.

    .venv/bin/python benchmarks/compiled_torch.py [--workload light-resnet50] [--rounds 15]
        [--number 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _args import repetitions

from d500 import threads  # noqa: E402
from d500.backends import get  # noqa: E402
from d500.networks import workloads  # noqa: E402
from d500.networks.inputs import make  # noqa: E402

BACKENDS = ("torch", "torch:compiled", "onnxruntime")
CONTENDERS = ("torch", "torch fx", "torch:compiled", "compiled py", "onnxruntime")


def static_fx(exe, feeds):
    """torch:compiled's static program for `feeds`, uncompiled, as a callable on NumPy feeds."""
    import torch

    from d500.backends.torch.compiled import trace
    tensors = exe._feeds(feeds)
    program, baked = trace(exe.native, tensors)
    free = [n for n in tensors if n not in baked]

    def run():
        with torch.no_grad():
            return exe._outputs(program(*[exe._feeds(feeds)[n] for n in free]))
    return run


def python_wrapper(model, feeds):
    """torch:compiled with Inductor's Python wrapper whatever the program's length, compiled,
    as a callable on NumPy feeds."""
    from d500.backends.torch import compiled
    bar, compiled.CPP_WRAPPER_FROM = compiled.CPP_WRAPPER_FROM, sys.maxsize
    try:
        exe = get("torch:compiled").prepare(model)
        exe.run(feeds)
    finally:
        compiled.CPP_WRAPPER_FROM = bar
    print(f"{'compiled py':<16} compile {exe.compile_time:7.2f} s, Inductor's "
          f"{exe.settings()['wrapper']} wrapper", flush=True)
    return lambda: exe.run(feeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="light-resnet50")
    ap.add_argument("--rounds", type=repetitions, default=15)
    ap.add_argument("--number", type=int, default=3, help="calls per backend per round")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    threads.configure(args.threads, threads.frameworks(BACKENDS))
    workload = workloads.load(workloads.find(args.workload))
    model, _ = workload.onnx_model()
    feeds = make(model, workload.seed, batch=workload.batch_size)
    runs = {}
    for name in BACKENDS:
        t0 = time.perf_counter()
        exe = get(name).prepare(model)
        exe.run(feeds)
        first = time.perf_counter() - t0
        compiled = getattr(exe, "compile_time", None)
        print(f"{name:<16} prepare + first call {first:7.2f} s"
              + (f"   (compile {compiled:.2f} s, {exe.compile_cache} cache, Inductor's "
                 f"{exe.settings()['wrapper']} wrapper)" if compiled is not None else ""),
              flush=True)
        runs[name] = lambda exe=exe: exe.run(feeds)
    runs["torch fx"] = static_fx(get("torch").prepare(model), feeds)
    runs["compiled py"] = python_wrapper(model, feeds)
    times = {name: [] for name in CONTENDERS}
    for r in range(args.rounds):
        order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
        for name in order:
            start = time.perf_counter()
            for _ in range(args.number):
                runs[name]()
            times[name].append((time.perf_counter() - start) / args.number)
    base = times["onnxruntime"]
    eager = times["torch"]
    print(f"\n{args.workload}, batch {workload.batch_size}, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.number} calls, load {os.getloadavg()[0]:.2f}")
    for name in CONTENDERS:
        ratios = [t / b for t, b in zip(times[name], base)]
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        print(f"{name:<16} {1e3 * statistics.median(times[name]):8.2f} ms   "
              f"/ onnxruntime {statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f})")
    speedup = [e / c for e, c in zip(eager, times["torch:compiled"])]
    print(f"torch eager / torch:compiled {statistics.median(speedup):.3f} (median per round)")
    speedup = [p / c for p, c in zip(times["compiled py"], times["torch:compiled"])]
    print(f"compiled py / torch:compiled {statistics.median(speedup):.3f} (median per round)")
    speedup = [e / c for e, c in zip(eager, times["torch fx"])]
    print(f"torch eager / torch fx       {statistics.median(speedup):.3f} (median per round)")


if __name__ == "__main__":
    main()
