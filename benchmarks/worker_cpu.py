"""The CPU time an honest level-2 worker uses per recorded thread and second worked.

d500.training.cpu fails a run over its framework's bound; this measures real 'd500 train
digits-mlp' runs on torch, tensorflow and jax, at --threads 1 and the default: every run's
ratio, the highest of each framework, and the machine's load.

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

from d500.training.cpu import SLACK_S, bound

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
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    seen: dict[str, list[float]] = {}
    failed = 0  # honest runs over the bound and its slack: false failures
    for backend in ("torch", "tensorflow", "jax"):
        for threads in (["--threads", "1"], []):
            for seed in range(args.runs):
                got = ratio(backend, threads, seed)
                seen.setdefault(backend, []).append(got["ratio"])
                failed += got["cpu_s"] > got["bound"] * got["threads"] * got["wall_s"] + SLACK_S
                print(f"{backend:10} {' '.join(threads) or 'default':11} threads {got['threads']}"
                      f"  cpu {got['cpu_s']:.3f} s  waited {got['waited_s']:.3f} s  "
                      f"worked {got['wall_s']:.3f} s  "
                      f"ratio {got['ratio']:.3f}", flush=True)
    for backend, ratios in seen.items():
        print(f"{backend}: highest ratio {max(ratios):.3f} of {len(ratios)} runs, bound "
              f"{bound(backend)}")
    print(f"honest runs failed (over the bound x threads x worked + {SLACK_S} s): {failed}; "
          f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
