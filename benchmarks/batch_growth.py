"""Learning-rate decay against the equivalent batch growth (Smith et al. 2018): digits-mlp's time
to its 0.97 target with sgd-momentum, same seeds, side by side in one process.

Both recipes start at batch 32 and lr 0.05 (momentum 0.9, no warm-up). The decay halves the lr
after epochs 2, 4 and 6 (`schedule: {name: step, milestones: [0.05, 0.1, 0.15], gamma: 0.5}` of
digits-mlp's 40 epochs); the growth keeps the lr and doubles the batch instead at the same epochs
(`batch_schedule: {growth: 2, every_epochs: 2, max: 256}`): the same noise scale lr/batch at
every epoch, fewer steps. Each seed runs both, in alternating order, through d500's own trainer
(a worker per run, the judge's clock); it prints each run's time to accuracy, epochs and steps,
the median per-seed ratio growth/decay (below 1: growth faster) with its range, and the load
average before and after.

    .venv/bin/python benchmarks/batch_growth.py [--seeds 5] [--backend torch] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]
DECAY = {"name": "step", "milestones": [0.05, 0.1, 0.15], "gamma": 0.5}
GROWTH = {"growth": 2, "every_epochs": 2, "max": 256}


def recipes() -> dict[str, object]:
    from d500.training import submission
    base = submission.load(ROOT / "submissions" / "sgd-momentum").recipe
    return {"decay": dataclasses.replace(base, schedule_spec=DECAY),
            "growth": dataclasses.replace(base, schedule_spec={"name": "constant"},
                                          batch_schedule=GROWTH)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--backend", default="torch")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    os.environ["D500_HOME"] = tempfile.mkdtemp(prefix="d500-batch-growth-")
    from d500 import threads
    from d500.ledger import Ledger
    from d500.training import trainer, workloads
    threads.configure(args.threads, threads.frameworks([args.backend]))
    wl = workloads.load(ROOT / "levels" / "2-training" / "digits-mlp.yaml")
    made, ledger = recipes(), Ledger()
    for recipe in made.values():
        recipe.check(wl)
    load = os.getloadavg()
    print(f"digits-mlp, sgd-momentum, {args.backend}, {args.threads} thread(s); load average "
          f"before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    ratios = []
    for seed in range(args.seeds):
        order = ("decay", "growth") if seed % 2 == 0 else ("growth", "decay")
        got = {}
        for name in order:
            result = trainer.train(wl, made[name], args.backend, seed, ledger=ledger,
                                   submission="sgd-momentum")
            f = result.figures
            got[name] = f.get("time_to_accuracy", float("inf"))
            print(f"  seed {seed} {name:6}: {result.status:9} time to accuracy "
                  f"{got[name]:7.3f} s, {f.get('epochs', float('inf')):g} epochs, "
                  f"{f.get('steps', float('inf')):g} steps", flush=True)
        ratios.append(got["growth"] / got["decay"])
    load = os.getloadavg()
    print(f"growth/decay time to accuracy, median of {len(ratios)} seeds: "
          f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
