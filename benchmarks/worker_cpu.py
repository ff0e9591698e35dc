"""The time an honest level-2 worker's threads are runnable per recorded thread and second worked.

d500.training.cpu fails a run over its framework's bound; this measures real 'd500 train
digits-mlp' runs on torch, tensorflow and jax, at --threads 1 and the default: every run's
figures (CPU time, waits, runnable time, CPU and runnable ratios), the highest runnable ratio of
each framework, and the machine's load (`--counts 1,2`: at --threads 1 and 2; backends may name
a mode: `--backends tensorflow:xla`).

    .venv/bin/python benchmarks/worker_cpu.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import repetitions

from d500.training.cpu import bound

ROOT = Path(__file__).resolve().parents[1]


def ratio(backend: str, threads: list[str], seed: int) -> dict:
    """One run's details.worker_cpu, in a fresh D500_HOME."""
    with tempfile.TemporaryDirectory() as home:
        done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                               "--submission", str(ROOT / "submissions" / "sgd-momentum"),
                               "--backend", backend, "--seed", str(seed), *threads],
                              cwd=ROOT, env={**os.environ, "D500_HOME": home},
                              capture_output=True, text=True, timeout=600)
        if done.returncode not in (0, 1):
            raise SystemExit(done.stderr)
        db = sqlite3.connect(Path(home) / "ledger.sqlite")
        (details,) = db.execute("SELECT details FROM runs").fetchone()
        db.close()
        return json.loads(details)["worker_cpu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=repetitions, default=3, help="runs of each (default 3)")
    parser.add_argument("--backends", default="torch,tensorflow,jax",
                        help="comma-separated (default torch,tensorflow,jax)")
    parser.add_argument("--counts", default="1,default",
                        help="comma-separated --threads counts, 'default' for none (default "
                             "1,default)")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    seen: dict[str, list[float]] = {}
    failed = 0  # honest runs over the bound and its slack: false failures
    for backend in args.backends.split(","):
        for count in args.counts.split(","):
            threads = [] if count == "default" else ["--threads", count]
            for seed in range(args.runs):
                got = ratio(backend, threads, seed)
                seen.setdefault(backend, []).append(got["ratio"])
                failed += got["runnable_s"] > got["bound"] * got["threads"] * got["wall_s"] + \
                    got["slack_s"]
                print(f"{backend:10} {' '.join(threads) or 'default':11} threads {got['threads']}"
                      f"  cpu {got['cpu_s']:.3f} s  waited {got['waited_s']:.3f} s  ended "
                      f"{got['ended_s']:.3f} s (+{got['ended_waited_s']:.3f} s waited)  held "
                      f"{got['paused_s']:.3f} s  runnable "
                      f"{got['runnable_s']:.3f} s  worked {got['wall_s']:.3f} s  cpu ratio "
                      f"{got['cpu_s'] / (got['threads'] * got['wall_s']):.3f}  "
                      f"ratio {got['ratio']:.3f}  load {os.getloadavg()[0]:.1f}", flush=True)
    for backend, ratios in seen.items():
        print(f"{backend}: highest ratio {max(ratios):.3f} of {len(ratios)} runs, bound "
              f"{bound(backend)}")
    print(f"honest runs failed (over the bound x threads x worked + slack): {failed}; "
          f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
