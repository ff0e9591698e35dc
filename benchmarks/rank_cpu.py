"""The time honest level-3 ranks' threads are runnable per recorded thread and second worked.

d500.training.cpu fails a run over its framework's bound; at level 3 the judge reads every rank on
rank 0's host (d500.distributed.jobtree) against the ranks there x each one's recorded threads,
and each of them alone against its recorded threads (judge.RankMeter), its bound x Ranks.leeway.
This measures real 'mpiexec -n 2 d500 train digits-mlp --threads 1' runs (two epochs) of each
entry and backend given: every run's figures, each rank's ratio, the highest runnable ratio of
each framework (pooled, and of a rank alone), the honest runs that failed, and the machine's load.

    .venv/bin/python benchmarks/rank_cpu.py --runs 2
    .venv/bin/python benchmarks/rank_cpu.py --runs 2 --cases sync:tensorflow,sync:jax
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
from pathlib import Path

import yaml
from _args import repetitions

from d500.distributed.judge import Ranks
from d500.distributed.launcher import launch_train
from d500.training.cpu import bound

ROOT = Path(__file__).resolve().parents[1]
CASES = ("sync:torch,ddp-baseline:torch,fsdp-baseline:torch,async-ps:torch,ps:torch,ssp:torch,"
         "dpsgd:torch,sync-powersgd:torch,zero-3:torch,pipeline-1f1b:torch,"
         "pipelining-baseline:torch,tensor-parallel:torch,tp-baseline:torch,sync:tensorflow,"
         "sync:jax,sync:reference")


def measured(entry: str, backend: str, seed: int) -> dict:
    """One run's details.worker_cpu, its status and each rank's ratio, in a fresh D500_HOME."""
    with tempfile.TemporaryDirectory() as tmp:
        data = yaml.safe_load((ROOT / "levels" / "3-distributed" / "digits-mlp.yaml").read_text())
        data["budget"]["max_epochs"] = 2
        workload = Path(tmp) / "digits-mlp.yaml"
        workload.write_text(yaml.safe_dump(data))
        home = Path(tmp) / "home"
        report = launch_train(workload, ROOT / "submissions" / entry, 2, backend=backend,
                              extra=("--seed", str(seed), "--threads", "1"),
                              env={**os.environ, "D500_HOME": str(home)})
        if not report.runs:
            raise SystemExit(f"{entry} on {backend}: {report.summary}\n{report.stderr[-2000:]}")
        db = sqlite3.connect(home / "ledger.sqlite")
        status, details = db.execute("SELECT status, details FROM runs").fetchone()
        db.close()
        details = json.loads(details)
        return {**details["worker_cpu"], "status": status,
                "ranks": {r: c["ratio"] for r, c in details.get("ranks_cpu", {}).items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=repetitions, default=2, help="runs of each (default 2)")
    parser.add_argument("--cases", default=CASES, help="ENTRY:BACKEND, comma-separated "
                        "(default: every level-3 scheme on torch, sync on the others)")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    seen: dict[str, list[float]] = {}
    alone: dict[str, list[float]] = {}  # each rank's ratio, by framework
    failed = 0  # honest runs over the bound and its slack: false failures
    for case in args.cases.split(","):
        entry, backend = case.split(":")
        for seed in range(args.runs):
            got = measured(entry, backend, seed)
            seen.setdefault(backend, []).append(got["ratio"])
            alone.setdefault(backend, []).extend(got["ranks"].values())
            failed += got["status"] == "failed"
            print(f"{entry:20} {backend:10} {got['status']:9} threads {got['threads']}  cpu "
                  f"{got['cpu_s']:.3f} s  waited {got['waited_s']:.3f} s  ended "
                  f"{got['ended_s']:.3f} s (+{got['ended_waited_s']:.3f} s waited)  held "
                  f"{got['paused_s']:.3f} s  runnable {got['runnable_s']:.3f} s  worked "
                  f"{got['wall_s']:.3f} s  ratio {got['ratio']:.3f}  ranks "
                  + " ".join(f"{r}:{v:.3f}" for r, v in sorted(got["ranks"].items()))
                  + f"  load {os.getloadavg()[0]:.1f}", flush=True)
    for backend, ratios in seen.items():
        one = max(alone.get(backend) or [float("nan")])
        print(f"{backend}: highest ratio {max(ratios):.3f} of {len(ratios)} runs, of a rank "
              f"alone {one:.3f}, bound {bound(backend) * Ranks.leeway:.3f}")
    print(f"honest runs failed: {failed}; load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
