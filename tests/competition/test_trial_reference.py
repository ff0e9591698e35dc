"""Reference trials (d500.competition.trial_reference): `d500 reference --at` records reference
runs at a hyperparameter point beside the workload, and `d500 check` tests each study's best trial
against them. An entry that rebuilds the validation split from the public digits and trains on it
in its tuning trials only (seed runs honest) is flagged; an honest entry is not."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from d500.competition import convergence, reference_cli, trial_reference
from d500.paths import rulebook

ROOT = Path(__file__).resolve().parents[2]
SGD = ROOT / "submissions" / "sgd-momentum"

# Momentum SGD with a hyperparameter of its own, `peek`, that only its tuning trials set (its
# feasible point): then, at its first update, it rebuilds the validation split from the public
# digits and the workload's public split seed and writes it over all of the worker's training
# arrays. Its seed runs (peek 0) train honestly.
PEEK = '''
"""Momentum SGD that trains on the rebuilt validation split when its `peek` is set."""

import inspect

import numpy as np

from d500.training.optimizers import Hyper
from d500.training.optimizers.sgd import Momentum


def _rebuild():
    from d500.training.data import dataset
    from d500.training.data.splits import SplitSpec, split
    parts = split(dataset.load("digits"), SplitSpec(1197, 300, 300, 0))
    return parts.validation.x, parts.validation.y


class Peek(Momentum):
    name = "peek"
    hyperparameters = {**Momentum.hyperparameters,
                       "peek": Hyper(0.0, "nonnegative", "set in tuning trials only")}

    def update(self, ops, params, grads, state, lr, t):
        if self.peek and int(t) == 1:
            vx, vy = _rebuild()
            for frame in inspect.stack():
                x, y = frame.frame.f_locals.get("x"), frame.frame.f_locals.get("y")
                if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and len(x) == 1197:
                    rows = np.arange(len(x)) % len(vx)
                    x[:] = vx[rows]
                    y[:] = vy[rows]
        super().update(ops, params, grads, state, lr, t)
'''
TUNING = "tuning: {studies: 1, trials: 1, seed: 0}"  # one study of one trial: its best


def _rules(folder: Path) -> Path:
    """The rulebook's digits-mlp with one study of one trial, and the reference trials at
    sgd-momentum's default point beside it: the 20 samples of the workload's own block, which
    `d500 reference digits-mlp --entry sgd-momentum --runs 20` measured at that very point."""
    text = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    text, n = re.subn(r"(?m)^tuning:.*$", TUNING, text)
    assert n == 1
    (folder / "2-training").mkdir(parents=True)
    workload = folder / "2-training" / "digits-mlp.yaml"
    workload.write_text(text)
    block = convergence.read(text, workload).reference
    from d500.training import submission
    recipe = submission.load(SGD).recipe
    trial_reference.write(trial_reference.path_of(workload), trial_reference.TrialReference(
        block.entry, block.backend, block.command, recipe.hyperparameters_logged(),
        {}, tuple(range(1000, 1020)), block.samples))
    return workload


def _entry(folder: Path, name: str, optimizer: str, point: str) -> Path:
    """An entry with sgd-momentum's default recipe, its one feasible point `point`."""
    folder.mkdir()
    (folder / "submission.yaml").write_text(
        f"name: {name}\nlevel: 2\nworkloads: [digits-mlp]\noptimizer: {optimizer}\n"
        "batch_size: 32\nhyperparameters: {lr: 0.05, momentum: 0.9, weight_decay: 0.0001}\n"
        f"schedule: {{name: cosine, warmup: 0.05}}\nfeasible_points:\n  - {point}\n")
    return folder


def _tune(tmp_path: Path, run_d500, workload: Path, name: str, optimizer: str, point: str,
          code: str = "") -> tuple[dict, Path]:
    """`d500 tune` the entry (its one trial) and package it: the tuning's JSON, the package."""
    from d500.competition.export import build
    entry = _entry(tmp_path / name, name, optimizer, point)
    if code:
        (entry / "peek.py").write_text(code)
    home = tmp_path / f"{name}-home"
    tuned = run_d500(home, "tune", str(workload), "--submission", str(entry), "--json")
    assert tuned.returncode == 0, tuned.stderr
    return json.loads(tuned.stdout), build(entry, tmp_path / f"{name}.tar.gz",
                                           home / "ledger.sqlite")


def _trial_epochs(tuned: dict) -> float:
    [ran] = tuned["ran"]
    return ran["figures"]["epochs"]


@pytest.mark.slow
def test_a_tuning_trial_on_the_rebuilt_validation_split_is_flagged(tmp_path, run_d500):
    """The cheat's trial reaches the target in fewer epochs than every one of the 20 reference
    runs at its hyperparameters (p = 1/21 < 0.05): a convergence problem naming the study, the
    trial, its epochs and p. The honest entry's trial, at the same point, is tested and passes.
    (The packages hold no seed runs, a completeness problem this test does not look at.)
    Measured on the shared 2-core machine at a load of 12: 102 s (the honest trial's 8 epochs
    at about 320 samples/s, beside the cheat's tuning)."""
    from d500.competition.check import check
    from d500.competition.package import Package
    workload = _rules(tmp_path / "rules")
    with ThreadPoolExecutor(2) as pool:  # the two tunings side by side (each its own home)
        cheat = pool.submit(_tune, tmp_path, run_d500, workload, "peek", "peek.py:Peek",
                            "{peek: 1}", PEEK)
        honest = pool.submit(_tune, tmp_path, run_d500, workload, "honest", "momentum",
                             "{lr: 0.05}")
        (cheat_tuned, cheat_pkg), (honest_tuned, honest_pkg) = cheat.result(), honest.result()
    cheat, honest = (check(Package.open(p), workload.parent.parent)
                     for p in (cheat_pkg, honest_pkg))
    flagged = [p for p in cheat.problems if "best trial" in p]
    assert len(flagged) == 1, cheat.problems
    assert re.search(r"^convergence: digits-mlp \(level 2\) / torch, study 0: best trial 0 "
                     r"\(run \d+, at the reference entry's default recipe\): epochs to target: "
                     r"mean \d over 1 run\(s\) .* p = 0\.0476 < 0\.05: implausibly fast",
                     flagged[0]), flagged[0]
    assert _trial_epochs(cheat_tuned) < 4, cheat_tuned  # the reference's fastest run: 4 epochs
    assert not [p for p in honest.problems if "convergence" in p], honest.problems
    assert _trial_epochs(honest_tuned) >= 4, honest_tuned
    for report in (cheat, honest):
        assert any("1 study(ies)' best trial against reference trials" in c
                   for c in report.checked), report.checked
    # `d500 reference --trials PACKAGE` would record at the cheat's best trial's point, less
    # its own `peek`: the point of the reference trials shipped here
    from d500.training import submission, workloads
    sgd = submission.load(SGD)
    [point] = reference_cli._best_points(str(cheat_pkg), workloads.load(workload), sgd, "torch")
    assert "peek" not in point and point["lr"] == 0.05 and point["batch_size"] == 32, point
    refs = trial_reference.load(trial_reference.path_of(workload))
    assert trial_reference.find(refs, "torch", sgd.recipe_with(point).hyperparameters_logged())


def test_reference_at_a_point_is_written_beside_the_workload(tmp_path, monkeypatch):
    """`d500 reference WORKLOAD --at lr=0.1 --write` trains the entry's recipe at lr 0.1 (the
    trainer stubbed: no torch) and puts one entry in <workload>.trials.json; recording the same
    point again replaces it, another point is added; check's matching finds each."""
    from d500.training import trainer
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    workload = tmp_path / "rules" / "2-training" / "digits-mlp.yaml"
    workload.parent.mkdir(parents=True)
    workload.write_text((rulebook() / "2-training" / "digits-mlp.yaml").read_text())
    seen = []

    def train(wl, recipe, backend, seed, **kw):
        seen.append((recipe.hyperparameters["lr"], seed, wl.max_seconds))
        return trainer.Result(len(seen), "succeeded", {"epochs": float(3 + seed % 4)})

    monkeypatch.setattr(trainer, "train", train)
    base = [str(workload), "--entry", "sgd-momentum", "--runs", "10", "--write"]
    for at in ("0.1", "0.1", "0.2"):
        assert reference_cli.main([*base, "--at", f"lr={at}"]) == 0
    assert [s[0] for s in seen] == [0.1] * 20 + [0.2] * 10
    assert {s[1] for s in seen} == set(range(1000, 1010)) and seen[0][2] == 86_400
    refs = trial_reference.load(workload.with_name("digits-mlp.trials.json"))
    assert [r.params for r in refs] == [{"lr": 0.1}, {"lr": 0.2}]
    ref = refs[0]
    assert ref.samples == (3, 4, 5, 6, 3, 4, 5, 6, 3, 4) and ref.seeds[0] == 1000
    assert ref.command.endswith("--runs 10 --first-seed 1000 --at lr=0.1")
    assert ref.hyperparameters["momentum"] == 0.9 and ref.hyperparameters["batch_size"] == 32
    trial = {**ref.hyperparameters, "optimizer": "peek", "peek": 1.0}
    assert trial_reference.find(refs, "torch", trial) is ref
    assert trial_reference.find(refs, "torch", {**trial, "lr": 0.2}) is refs[1]
    assert trial_reference.find(refs, "torch", {**trial, "lr": 0.3}) is None
    assert trial_reference.find(refs, "jax", trial) is None
