"""The rules choose the seeds at level 3 too (issue 17), with real `mpiexec -n 2` jobs: a seed the
sender picks (`--seed 11`) is an exploration, listed by check and never scored; the required
seed's run deleted from the ledger, the chain re-linked and re-sealed as d500 seals it, is a
missing seed at its world size and a run id the chain skips. (Level 2's twins, and the killed
seed: tests/competition/test_seeds.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from d500.competition.check import check
from d500.competition.package import Package
from d500.ledger import Ledger
from d500.training import score
from d500.training.seeds import required
from tests.competition.test_seeds import delete_and_relink
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

NAME = "l3-seeds"
WHERE = "digits-mlp (level 3) / torch x2 ranks"


def _package(home: Path, entry: Path, out: Path) -> Package:
    done = jobs.plain_d500(home, "package", str(entry), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return Package.open(out)


@pytest.mark.slow  # two real 2-rank jobs of one epoch each: ~15 s
def test_a_scouted_level3_seed_never_scores_and_a_deleted_one_is_missing(tmp_path):
    rules = tmp_path / "rules"
    (rules / "3-distributed").mkdir(parents=True)
    wl = jobs.workload(rules / "3-distributed", "digits-mlp", seeds=2, budget={"max_epochs": 1})
    entry = jobs.entry(tmp_path, "sync", folder="entry", name=NAME)
    home = tmp_path / "home"
    first, second = required(3, "digits-mlp", NAME, "torch", 2, 2)
    for extra in (("--seeds", "1"), ("--seed", "11")):  # the first required seed, then a scout
        done = jobs.train(home, 2, wl, entry, *extra)
        assert done.returncode in (0, 1), done.stderr  # 1: one epoch misses the target
    ledger = home / "ledger.sqlite"
    with Ledger(ledger) as book:
        runs = {r["seed"]: r for r in book.runs(level=3)}
        [scored] = score.entries(book.runs(level=3))
    assert sorted(runs) == sorted([first, 11]) and runs[11]["world_size"] == 2
    assert [r["id"] for r in scored.seeds] == [runs[first]["id"]]  # the scout never scores
    assert [r["id"] for r in scored.explorations] == [runs[11]["id"]]
    missing = (f"completeness: {WHERE}: required seed(s) {{}} (of the workload's 2) have no "
               f"run: the rules choose the seeds (`mpiexec -n 2 d500 train` without --seed runs "
               f"them)")
    report = check(_package(home, entry, tmp_path / "scouted.tar.gz"), rules)
    assert report.problems == [missing.format(second)]  # the scout stands in for no seed
    assert report.not_scored == [f"{WHERE}: run(s) {runs[11]['id']} (seed(s) 11) are "
                                 f"explorations: seeds the rules did not choose"]
    # the required seed's row deleted and the chain re-linked: the forgery verifies, and check
    # names the seed it lacks and the run id the chain skips
    delete_and_relink(ledger, [runs[first]["id"]])
    verified = jobs.plain_d500(home, "ledger", "--ledger", str(ledger), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = check(_package(home, entry, tmp_path / "deleted.tar.gz"), rules)
    assert report.problems == [
        missing.format(f"{first}, {second}"),
        f"completeness: the chain skips run id(s) {runs[first]['id']}: rows deleted from the "
        f"ledger (a hidden run), or runs not yet ended when it was packaged"], report.problems
