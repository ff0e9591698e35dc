"""Entry names as a seed scout: each name's required seeds trained, their epochs to target.

    .venv/bin/python benchmarks/seed_names.py [--names 10] [--workload digits-mlp]
        [--entry sgd-momentum] [--backend torch]

The rules derive a result's required seeds from the workload, the entry's name and the backend
(d500.training.seeds.required), and the name is the sender's: trying names in a throw-away home
and submitting under the fastest is scouting seeds by another route. Trains, for names
scout-0..scout-K-1, the entry's recipe at each name's required seeds (a throw-away D500_HOME,
the workload's rules), and prints each name's epochs to target and their median, then the
spread of the names' medians and the reference-convergence verdict (d500 check's) on the best
and the worst name's succeeded runs. Epochs do not depend on the machine; `uptime` is printed.

With `--fresh N[,N...]` it then says how often `d500 reproduce --fresh-seeds N` would flag the
best name and how often an honest result (3 runs drawn at random from the same pool): the fresh
runs are drawn (with replacement, `--draws` times, from a fixed seed) from the workload's
reference runs, which are the same entry's default recipe on the same backend at other seeds, and
tested as reproduce tests them (d500.competition.reproduce_seeds.verdict)."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=10)
    parser.add_argument("--workload", default="digits-mlp")
    parser.add_argument("--entry", default="sgd-momentum")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--fresh", default="", help="fresh-seed counts to judge the best name at")
    parser.add_argument("--draws", type=int, default=1000)
    args = parser.parse_args()
    os.environ["D500_HOME"] = tempfile.mkdtemp(prefix="d500-seed-names-")
    from d500.competition import convergence
    from d500.ledger import Ledger
    from d500.training import submission, trainer, workloads
    from d500.training.seeds import required

    path = ROOT / "levels" / "2-training" / f"{args.workload}.yaml"
    wl = workloads.load(path)
    entry = submission.load(ROOT / "submissions" / args.entry)
    ledger = Ledger()
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    found = []
    for k in range(args.names):
        name = f"scout-{k}"
        epochs = []
        for seed in required(2, args.workload, name, args.backend, wl.seeds):
            run = trainer.train(wl, entry.recipe, args.backend, seed, ledger=ledger,
                                submission=name)
            epochs.append(ledger.get(run.run_id)["figures"].get("epochs", math.inf))
        found.append((statistics.median(epochs), name, epochs))
        print(f"{name}: epochs to target {epochs}, median {statistics.median(epochs):g}",
              flush=True)
    found.sort()
    medians = [m for m, _, _ in found]
    print(f"names' medians: {min(medians):g} to {max(medians):g}, their median "
          f"{statistics.median(medians):g}")
    reference = convergence.read(path.read_bytes(), str(path)).reference
    for label, (_, name, epochs) in (("best", found[0]), ("worst", found[-1])):
        ok = [e for e in epochs if math.isfinite(e)]
        verdict = convergence.check_epochs(reference, ok, batch_size=entry.recipe.batch_size)
        print(f"{label} {name}: {verdict.status}: {verdict.reason}")
    for n in (int(v) for v in args.fresh.split(",") if v):
        power(reference.samples, found[0][2], wl.max_epochs, n, args.draws)
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def power(pool: tuple[float, ...], best: list[float], max_epochs: int, n: int, draws: int
          ) -> None:
    """How often --fresh-seeds n flags the best name's runs, and an honest result's."""
    import numpy as np

    from d500.competition.reproduce_seeds import verdict
    rng = np.random.default_rng(0)
    recorded = [e if math.isfinite(e) else max_epochs + 1 for e in best]
    flagged = honest = 0
    for _ in range(draws):
        fresh = [float(v) for v in rng.choice(pool, n)]
        flagged += not verdict("w", "e", "b", recorded, fresh, 0).agrees
        fair = [float(v) for v in rng.choice(pool, len(recorded))]
        honest += not verdict("w", "e", "b", fair, fresh, 0).agrees
    print(f"--fresh-seeds {n}: the best name {recorded} flagged in {flagged / draws:.1%} of "
          f"{draws} draws of fresh runs from the {len(pool)} reference runs; an honest result "
          f"of {len(recorded)} runs from the same pool in {honest / draws:.1%}")


if __name__ == "__main__":
    main()
