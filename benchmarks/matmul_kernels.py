"""torch.matmul (MKL's sgemm) against oneDNN's linear on BERT-base's matrix shapes, interleaved.

Why d500's torch MatMul runs a matrix stored transposed as oneDNN's linear at inference
(d500/backends/torch/linalg.py): per shape [M, K] x [K, N] (M = 128 tokens), the GFLOP/s of
each kernel and the median of the per-repetition time ratios oneDNN / MKL, with their quartiles,
the weight stored [N, K] as a tied output projection has it. Prints the load average.

    .venv/bin/python benchmarks/matmul_kernels.py [--repetitions 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _args import repetitions

# BERT-base at sequence 128: Q/K/V/O projections, the feed-forward pair, the vocabulary head.
SHAPES = ((768, 768), (768, 3072), (3072, 768), (768, 8192), (768, 30522))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=repetitions, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m = args.tokens
    print(f"[{m}, K] x [K, N], {args.threads} thread(s), load {os.getloadavg()[0]:.2f}")
    for k, n in SHAPES:
        a, w = torch.randn(1, m, k), torch.randn(n, k)
        kernels = {"mkl": lambda: a @ w.t(),
                   "onednn": lambda: torch.ops.mkldnn._linear_pointwise(a, w, None, "none",
                                                                         [], "")}
        assert torch.allclose(kernels["mkl"](), kernels["onednn"](), rtol=1e-4, atol=1e-3)
        number = max(1, int(2e8 / (m * k * n)))
        times = {name: [] for name in kernels}
        for r in range(args.repetitions):
            for name in (list(kernels) if r % 2 else list(kernels)[::-1]):
                start = time.perf_counter()
                for _ in range(number):
                    kernels[name]()
                times[name].append((time.perf_counter() - start) / number)
        flop = 2 * m * k * n
        ratios = [o / s for o, s in zip(times["onednn"], times["mkl"])]
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        print(f"K {k:5d} N {n:6d}: mkl {flop / statistics.median(times['mkl']) / 1e9:5.1f} "
              f"GFLOP/s, onednn {flop / statistics.median(times['onednn']) / 1e9:5.1f}; "
              f"onednn / mkl {statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f})")
    print(f"load {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
