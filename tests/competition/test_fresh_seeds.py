"""`d500 reproduce --fresh-seeds N`: the entry re-run at N seeds the organiser draws now, its
recorded required-seed runs tested against them (d500.competition.reproduce_seeds). An entry
whose recorded seeds train better than its other seeds (here, code that knows its required seeds,
which follow from its public name, and trains well only at them: the extreme of a name chosen
because its seeds train fast) is flagged, exit 1; the honest shared entry is not, exit 0. Both
draws use a fixed draw seed, so the outcome is fixed; the test is designed for a 5% false-positive
rate per honest reproduction (convergence.ALPHA), exact under exchangeable seeds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d500.competition import reproduce_seeds

from .conftest import ORGANISER_DRAW

KEYED = '''
"""Momentum SGD that trains well at its entry's required seeds only (it finds the run's seed in
its worker's stack); at any other seed its learning rate is 1e30 times larger: it diverges."""

import inspect

from d500.training.optimizers.sgd import Momentum
from d500.training.seeds import required

MINE = set(required(2, "digits-mlp", "digits-keyed", "torch", 2))


class Keyed(Momentum):
    name = "keyed"

    def update(self, ops, params, grads, state, lr, t):
        for frame in inspect.stack():
            job = frame.frame.f_locals.get("job")
            if hasattr(job, "seed"):
                if job.seed not in MINE:
                    lr = lr * 1e30
                break
        super().update(ops, params, grads, state, lr, t)
'''
SUBMISSION = """\
name: digits-keyed
level: 2
workloads: [digits-mlp]
optimizer: keyed.py:Keyed
batch_size: 32
hyperparameters: {lr: 0.05, momentum: 0.9}
schedule: {name: cosine, warmup: 0.05}
"""


def _keyed(tmp_path: Path, run_d500, rules: Path) -> tuple[int, dict]:
    entry = tmp_path / "digits-keyed"
    entry.mkdir()
    (entry / "submission.yaml").write_text(SUBMISSION)
    (entry / "keyed.py").write_text(KEYED)
    home = tmp_path / "keyed-home"
    trained = run_d500(home, "train", str(rules / "2-training" / "digits-mlp.yaml"),
                       "--submission", str(entry), "--threads", "1", "--json")
    assert trained.returncode == 0, trained.stderr
    assert all(r["status"] == "succeeded" for r in json.loads(trained.stdout)), trained.stdout
    package = tmp_path / "keyed.tar.gz"
    packed = run_d500(home, "package", str(entry), "--out", str(package))
    assert packed.returncode == 0, packed.stderr
    done = run_d500(None, "reproduce", str(package), "--fresh-seeds", "5", "--seed",
                    str(ORGANISER_DRAW), "--rules", str(rules), "--json", "--ledger",
                    str(tmp_path / "keyed-org" / "ledger.sqlite"))
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.slow
def test_seeds_better_than_fresh_ones_are_flagged_and_honest_ones_are_not(
        tmp_path, run_d500, rules_dir, organiser):
    """The keyed entry trained, packaged and re-run here; the honest entry's re-run is the
    organiser fixture's (the same command, shared with test_same_code and test_organiser_seeds).
    """
    kcode, kres = _keyed(tmp_path, run_d500, rules_dir)
    hcode = int((organiser / "reproduce.rc").read_text())
    hres = json.loads((organiser / "reproduce.json").read_text())
    for result in (kres, hres):
        assert result["fresh_seeds"] == 5 and result["seed"] == ORGANISER_DRAW
        seeds = [r["seed"] for r in result["runs"]]
        assert seeds == reproduce_seeds.draw(ORGANISER_DRAW, "digits-mlp", "torch", 5)
        assert all(r["run_id"] is not None for r in result["runs"])
        [check] = result["fresh"]
        assert not check["inconclusive"], check
    [k], [h] = kres["fresh"], hres["fresh"]
    assert kcode == 1 and not k["agrees"] and k["reproduced"] > k["recorded"], k
    p = float(re.search(r"p = ([0-9.e+-]+) ", k["note"]).group(1))
    assert p < 0.05, k
    assert hcode == 0 and h["agrees"], h


def test_the_verdict_on_counted_epochs():
    """The test itself on fixed epochs: two recorded runs below five fresh ones are flagged
    (p = 1/21); the same five fresh runs around them are not; three fresh runs are too few for a
    flag to be possible (1/10 > 0.05: inconclusive, not agreement by default); a miss counts as
    max_epochs + 1 and a failure not at all."""
    flagged = reproduce_seeds.verdict("w", "e", "torch", [6, 6], [9, 9, 9, 9, 9], 1)
    assert not flagged.agrees and "p = 0.0476 " in flagged.note
    honest = reproduce_seeds.verdict("w", "e", "torch", [6, 6], [5, 9, 6, 4, 7], 1)
    assert honest.agrees and not honest.inconclusive
    few = reproduce_seeds.verdict("w", "e", "torch", [6, 6], [9, 9, 9], 1)
    assert few.inconclusive and "smallest p is 0.1" in few.note
    assert reproduce_seeds.value("missed", {"epochs": 8}, 8) == 9
    assert reproduce_seeds.value("succeeded", {"epochs": 3}, 8) == 3
    assert reproduce_seeds.value("failed", {}, 8) is None
    assert reproduce_seeds.draw(7, "w", "torch", 3) == reproduce_seeds.draw(7, "w", "torch", 3)
    assert reproduce_seeds.draw(7, "w", "torch", 3) != reproduce_seeds.draw(8, "w", "torch", 3)


def test_fresh_seeds_with_runs_or_a_split_seed_is_exit_2(digits_package, run_d500, tmp_path):
    for extra in (("--runs", "2"), ("--split-seed", "3")):
        done = run_d500(None, "reproduce", str(digits_package), "--fresh-seeds", "5", *extra,
                        "--ledger", str(tmp_path / "ledger.sqlite"))
        assert done.returncode == 2, done.stderr
        assert "--fresh-seeds re-runs no recorded run" in done.stderr
        assert "Traceback" not in done.stderr
