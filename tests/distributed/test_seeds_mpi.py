"""The rules choose the seeds at level 3 too (issue 17), with real `mpiexec -n 2` jobs: a seed the
sender picks (`--seed 11`) is an exploration, listed by check and never scored; the required
seed's run deleted from the ledger, the chain re-linked and re-sealed as d500 seals it, is a
missing seed at its world size and a run id the chain skips; a required seed's job killed from
outside is refused and a miss until `mpiexec -n 2 d500 train` runs it again. (Level 2's twins:
tests/competition/test_seeds.py.)"""

from __future__ import annotations

import math

import pytest

from d500.competition.check import check
from d500.distributed.launcher import train_argv
from d500.ledger import Ledger
from d500.training import score
from d500.training.seeds import required
from tests.competition.seed_attacks import delete_and_relink, kill_once_evaluated, package
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

NAME = "l3-seeds"
WHERE = "digits-mlp (level 3) / torch x2 ranks"


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
    report = check(package(jobs.plain_d500, home, entry, tmp_path / "scouted.tar.gz"), rules)
    assert report.problems == [missing.format(second)]  # the scout stands in for no seed
    assert report.not_scored == [f"{WHERE}: run(s) {runs[11]['id']} (seed(s) 11) are "
                                 f"explorations: seeds the rules did not choose"]
    # the required seed's row deleted and the chain re-linked: the forgery verifies, and check
    # names the seed it lacks and the run id the chain skips
    delete_and_relink(ledger, [runs[first]["id"]])
    verified = jobs.plain_d500(home, "ledger", "--ledger", str(ledger), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = check(package(jobs.plain_d500, home, entry, tmp_path / "deleted.tar.gz"), rules)
    assert report.problems == [
        missing.format(f"{first}, {second}"),
        f"completeness: the chain skips run id(s) {runs[first]['id']}: rows deleted from the "
        f"ledger (a hidden run), or runs not yet ended when it was packaged"], report.problems


# momentum SGD that, with D500_TEST_SLOW set, sleeps 0.2 s a step after its first epoch (37
# steps): a job long enough to be killed once its first evaluation is in the ledger
SLOW = '''
import os
import time

from d500.training.optimizers.sgd import Momentum


class Sgd(Momentum):
    name = "slowsgd"

    def update(self, ops, params, grads, state, lr, t):
        if os.environ.get("D500_TEST_SLOW") and int(t) > 37:
            time.sleep(0.2)
        super().update(ops, params, grads, state, lr, t)
'''


@pytest.mark.slow  # three real 2-rank jobs of at most 2 epochs: ~20-35 s
def test_a_killed_level3_seed_is_refused_and_a_miss_until_re_run(tmp_path):
    """The first required seed run; the second's job SIGKILLed (every rank and mpiexec) once it
    evaluated, recorded interrupted by `d500 ledger list`: check refuses it, the board counts it
    as a miss (∞); `mpiexec -n 2 d500 train` runs it, and only it, again."""
    rules = tmp_path / "rules"
    (rules / "3-distributed").mkdir(parents=True)
    wl = jobs.workload(rules / "3-distributed", "digits-mlp", seeds=2, budget={"max_epochs": 2})
    entry = jobs.entry(tmp_path, "sync", folder="entry", name="l3-kill", files={"slow.py": SLOW},
                       optimizer="slow.py:Sgd")
    home, ledger = tmp_path / "home", tmp_path / "home" / "ledger.sqlite"
    first, second = required(3, "digits-mlp", "l3-kill", "torch", 2, 2)
    done = jobs.train(home, 2, wl, entry, "--seeds", "1")
    assert done.returncode in (0, 1), done.stderr
    kill_once_evaluated(train_argv(wl, entry, 2, extra=()), home.parent,
                        jobs.environment(home, D500_TEST_SLOW="1"), ledger, second, deadline=180)
    listed = jobs.plain_d500(home, "ledger", "list")  # seals the dead job's run as interrupted
    assert listed.returncode == 0, listed.stderr
    with Ledger(ledger) as book:
        runs = book.runs(level=3)
        [scored] = score.entries(runs)
    killed = next(r for r in runs if r["seed"] == second)
    assert killed["status"] == "interrupted"
    assert killed["id"] in [r["id"] for r in scored.seeds]  # counted, as a miss
    assert score.over_seeds([score.time_to_target(r) for r in scored.seeds]).median == math.inf
    report = check(package(jobs.plain_d500, home, entry, tmp_path / "killed.tar.gz"), rules)
    assert report.problems == [
        f"completeness: {WHERE}: required seed {second} (of the workload's 2) only interrupted "
        f"(run(s) {killed['id']}): a miss until re-run to completion (`mpiexec -n 2 d500 train` "
        f"without --seed runs it again)"]
    again = jobs.train(home, 2, wl, entry)
    assert again.returncode in (0, 1), again.stderr
    with Ledger(ledger) as book:
        newer = [r for r in book.runs(level=3) if r["id"] > killed["id"]]
    assert [r["seed"] for r in newer] == [second]  # only the one left
    report = check(package(jobs.plain_d500, home, entry, tmp_path / "rerun.tar.gz"), rules)
    assert report.problems == [], report.problems
