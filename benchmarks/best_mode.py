"""Each framework's best d500 mode against the best inference peer, side by side, interleaved.

Issue 18's targets for a level-1 workload (the BERT-base-shaped encoder by default): the best
d500 mode (a trainable backend: torch, torch:compiled, tensorflow, tensorflow:xla, jax) at or
below the best peer's latency (an inference-only backend: onnxruntime, openvino), and every
framework's best mode within 1.5x of the fastest engine.

Every backend prepares the workload's model and is timed on the same input in rounds whose order
rotates, so a burst of load from other processes hits every backend alike. Each framework's best
mode and the best peer are the ones with the lowest median; the ratios are medians of the
per-round ratios, with their quartiles. It prints the load average before and after.
`--mkl-torch` adds the contender "torch mkl": eager torch with every MatMul on torch.matmul
(MKL's sgemm), as before d500's MatMul ran wide transposed matrices as oneDNN's linear.

    .venv/bin/python benchmarks/best_mode.py [--workload bert-base-shaped] [--rounds 9]
        [--number 1] [--threads 1] [--backends torch,torch:compiled,...] [--mkl-torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from _args import repetitions

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from d500 import threads  # noqa: E402
from d500.backends import get, split  # noqa: E402
from d500.networks import workloads  # noqa: E402
from d500.networks.inputs import make  # noqa: E402

BACKENDS = "torch,torch:compiled,tensorflow,tensorflow:xla,jax,onnxruntime,openvino"


def quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return f"{statistics.median(values):.3f} (IQR {q[0]:.3f}-{q[2]:.3f})"


def mkl_only(run):
    """`run` with torch's MatMul on torch.matmul for every width (d500's oneDNN path off)."""
    from d500.backends.torch import linalg

    def call():
        saved, linalg.WIDE = linalg.WIDE, float("inf")
        try:
            return run()
        finally:
            linalg.WIDE = saved
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="bert-base-shaped")
    ap.add_argument("--backends", default=BACKENDS)
    ap.add_argument("--rounds", type=repetitions, default=9)
    ap.add_argument("--number", type=int, default=1, help="calls per backend per round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mkl-torch", action="store_true",
                    help="add eager torch with oneDNN's wide MatMul turned off")
    args = ap.parse_args()
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    threads.configure(args.threads, threads.frameworks(names))
    workload = workloads.load(workloads.find(args.workload))
    model, _ = workload.onnx_model()
    feeds = make(model, workload.seed, batch=workload.batch_size)
    print(f"{args.workload}, batch {workload.batch_size}, {args.threads} thread(s); load "
          f"{os.getloadavg()[0]:.2f} before", flush=True)
    runs, peers, outputs = {}, set(), {}
    for name in names:
        t0 = time.perf_counter()
        exe = get(name).prepare(model)
        outputs[name] = exe.run(feeds)[0]
        compiled = getattr(exe, "compile_time", None)
        print(f"{name:<16} prepare + first call {time.perf_counter() - t0:7.2f} s"
              + (f"   (compile {compiled:.2f} s)" if compiled is not None else ""), flush=True)
        runs[name] = lambda exe=exe: exe.run(feeds)
        if not get(name).trainable:
            peers.add(name)
    if args.mkl_torch and "torch" in runs:
        runs["torch mkl"] = mkl_only(runs["torch"])
        outputs["torch mkl"] = runs["torch mkl"]()[0]
        names.append("torch mkl")
    first = outputs[names[0]]
    for name in names[1:]:  # a timing of a wrong answer would mean nothing
        err = float(np.max(np.abs(outputs[name] - first)) / np.max(np.abs(first)))
        print(f"{name:<16} max relative difference from {names[0]}: {err:.1e}")
    times = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            for _ in range(args.number):
                runs[name]()
            times[name].append((time.perf_counter() - start) / args.number)
    median = {name: statistics.median(t) for name, t in times.items()}
    fastest = min(names, key=median.get)
    best: dict[str, str] = {}  # framework -> its mode with the lowest median
    for name in sorted(names, key=median.get):
        if name != "torch mkl":  # a variant of torch's mode, not a mode
            best.setdefault(split(name)[0], name)
    print(f"\n{args.rounds} rounds x {args.number} calls; load {os.getloadavg()[0]:.2f} after")
    for name in sorted(names, key=median.get):
        ratios = [t / f for t, f in zip(times[name], times[fastest])]
        print(f"{name:<16} {1e3 * median[name]:9.2f} ms   / {fastest} {quartiles(ratios)}"
              + ("   (peer)" if name in peers else ""))
    print(f"\neach framework's best d500 mode / the fastest engine ({fastest}; target <= 1.5):")
    for framework, name in best.items():
        if name in peers:
            continue
        ratios = [t / f for t, f in zip(times[name], times[fastest])]
        print(f"  {framework:<12} {name:<16} {quartiles(ratios)}")
    if "torch mkl" in times:
        ratios = [t / m for t, m in zip(times["torch"], times["torch mkl"])]
        print(f"torch / torch mkl (oneDNN's wide MatMul on / off): {quartiles(ratios)}")
    ours = [n for n in best.values() if n not in peers]
    theirs = [n for n in best.values() if n in peers]
    if ours and theirs:
        d500, peer = ours[0], theirs[0]
        ratios = [t / p for t, p in zip(times[d500], times[peer])]
        print(f"best d500 mode {d500} / best peer {peer}: {quartiles(ratios)} (target <= 1)")


if __name__ == "__main__":
    main()
