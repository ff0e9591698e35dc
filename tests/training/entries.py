"""The entries level 2's attack tests write (tests/training): the attack's optimizer file in a
folder of its own beside sgd-momentum's submission.yaml, untuned (lr 0.1), and one run of it on
digits-mlp with the judge in the test's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from d500.ledger import Ledger
from d500.training import submission, trainer, workloads

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "levels" / "2-training" / "digits-mlp.yaml"
SGD = ROOT / "submissions" / "sgd-momentum"


def folder(tmp_path: Path, code: str, cls: str, name: str = "attack") -> Path:
    """tmp_path/entry: `code` as opt.py, its class `cls` the optimizer of submission `name`."""
    where = tmp_path / "entry"
    where.mkdir()
    (where / "opt.py").write_text(code)
    data = yaml.safe_load((SGD / "submission.yaml").read_text())
    data.update(name=name, optimizer=f"opt.py:{cls}", hyperparameters={"lr": 0.1},
                search_space={}, feasible_points=[])
    (where / "submission.yaml").write_text(yaml.safe_dump(data))
    return where


def entry(tmp_path: Path, code: str, cls: str, name: str = "attack") -> submission.Submission:
    """`folder`'s entry, loaded (its optimizer file checked in a child process)."""
    return submission.load(folder(tmp_path, code, cls, name))


def run(entry: submission.Submission, epochs: int = 1, ledger: Ledger | None = None,
        checkpoints: Any = None) -> trainer.Result:
    """One run of `entry` on digits-mlp for `epochs` epochs (torch, seed 0), recorded under its
    name in `ledger`, else in a new one in $D500_HOME; `checkpoints` (resume.Checkpoints):
    written as the run goes."""
    wl = workloads.load(MLP)
    wl.max_epochs = epochs
    return trainer.train(wl, entry.recipe, "torch", 0,
                         ledger=Ledger() if ledger is None else ledger, submission=entry.name,
                         submission_files=entry.files, checkpoints=checkpoints)
