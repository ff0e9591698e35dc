"""`d500 reproduce --split-seed S`: an entry whose optimizer rebuilds the held-out validation split
from the public digits (and the workload's public split seed) and writes it over the training
arrays its worker holds reaches the target fast under the workload's split and loses that speed
under a split it never saw: the pooled epochs-to-target check flags it; an honest entry agrees."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PEEK = '''
"""Momentum SGD that, at its first update, rebuilds the validation split from the public digits
and the workload's split seed, and writes it (three times) over the worker's training arrays."""

import inspect

import numpy as np

from d500.training.optimizers.sgd import Momentum


def _rebuild():
    from d500.training.data import dataset
    from d500.training.data.splits import SplitSpec, split
    parts = split(dataset.load("digits"), SplitSpec(1197, 300, 300, 0))
    return parts.validation.x, parts.validation.y


class Peek(Momentum):
    name = "peek"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1:
            vx, vy = _rebuild()
            for frame in inspect.stack():
                x, y = frame.frame.f_locals.get("x"), frame.frame.f_locals.get("y")
                if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and len(x) == 1197:
                    for k in range(3):
                        x[k * 300:(k + 1) * 300] = vx
                        y[k * 300:(k + 1) * 300] = vy
        super().update(ops, params, grads, state, lr, t)
'''


def _entry(folder: Path, name: str, optimizer: str) -> Path:
    folder.mkdir()
    (folder / "submission.yaml").write_text(
        f"name: {name}\nlevel: 2\nworkloads: [digits-mlp]\noptimizer: {optimizer}\n"
        "batch_size: 32\nhyperparameters: {lr: 0.05, momentum: 0.9}\n"
        "schedule: {name: cosine, warmup: 0.05}\n"
        "search_space: {lr: {min: 0.01, max: 0.1, scale: log}}\n")
    return folder


def _reproduce(tmp_path: Path, run_d500, name: str, optimizer: str, code: str = "") -> dict:
    """Train the entry's three required seeds, package them, re-run all three under split seed
    777: the reproduction's JSON."""
    entry = _entry(tmp_path / name, name, optimizer)
    if code:
        (entry / "peek.py").write_text(code)
    home = tmp_path / f"{name}-home"
    trained = run_d500(home, "train", "digits-mlp", "--submission", str(entry), "--json")
    assert trained.returncode == 0, trained.stderr
    package = tmp_path / f"{name}.tar.gz"
    packed = run_d500(home, "package", str(entry), "--out", str(package))
    assert packed.returncode == 0, packed.stderr
    done = run_d500(None, "reproduce", str(package), "--runs", "3", "--seed", "0",
                    "--split-seed", "777", "--json", "--ledger",
                    str(tmp_path / f"{name}-org" / "ledger.sqlite"))
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["agrees"] else 1)
    return result


def _p(pooled: dict) -> float:
    return float(re.search(r"p = ([0-9.e+-]+) ", pooled["note"]).group(1))


@pytest.mark.slow
def test_a_rebuilt_validation_split_loses_its_speed_under_a_fresh_split(tmp_path, run_d500):
    """Both entries' three seed runs re-run under split seed 777: the cheat's epochs to target
    grow by more than the honest entry's, and its departure is the less likely one under the
    reference's pairs. (With 3 runs on digits-mlp the cheat's departure, about 2 epochs here, is
    not flagged at p = 0.05: the reference's own spread is 4-10 epochs; see reproduce_split.)"""
    # the two entries' train-package-reproduce chains run side by side (each its own homes and
    # ledgers; a split-seed reproduction judges epochs alone, never times)
    with ThreadPoolExecutor(2) as pool:
        cheat = pool.submit(_reproduce, tmp_path, run_d500, "peek", "peek.py:Peek", PEEK)
        honest = pool.submit(_reproduce, tmp_path, run_d500, "honest", "momentum")
        cheat, honest = cheat.result(), honest.result()
    for result in (cheat, honest):
        assert result["split_seed"] == 777
        [pooled] = result["split"]
        assert pooled["check"] == "digits-mlp: mean epochs to target under split seed 777"
        assert not pooled["inconclusive"], pooled
        assert all(run["agrees"] for run in result["runs"])  # each run reported, not judged
    [c], [h] = cheat["split"], honest["split"]
    assert c["recorded"] <= 5 and c["reproduced"] - c["recorded"] >= 1.5, c
    assert c["reproduced"] - c["recorded"] > h["reproduced"] - h["recorded"], (c, h)
    assert _p(c) < _p(h) and h["agrees"], (c, h)


def test_the_pooled_verdict_on_the_measured_epochs():
    """The epochs measured by hand (reproduce_split's docstring): the cheat's three seeds 3, 3, 3
    became 6, 6, 7 under split seed 777 (flagged); sgd-momentum's 6, 10, 7 became 5, 5, 7."""
    from d500.competition import convergence, reproduce_split
    reference = convergence.read((ROOT / "levels" / "2-training" / "digits-mlp.yaml")
                                 .read_bytes(), "digits-mlp.yaml").reference
    flagged = reproduce_split.pooled("digits-mlp", [(3, 6), (3, 6), (3, 7)], reference, 777)
    assert not flagged.agrees and _p({"note": flagged.note}) < 0.05
    honest = reproduce_split.pooled("digits-mlp", [(6, 5), (10, 5), (7, 7)], reference, 777)
    assert honest.agrees and honest.note.startswith("p = 1 ")
    one = reproduce_split.pooled("digits-mlp", [(3, 7)], reference, 777)  # one run: +4 is
    assert one.agrees and _p({"note": one.note}) == pytest.approx(0.0658, abs=1e-3)  # 6.6%
    missed = reproduce_split.check({"epochs": 3.0}, {}, ("succeeded", "missed"), "epochs", 777)
    assert missed.inconclusive and "not judged" in missed.note
