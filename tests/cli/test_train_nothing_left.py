"""`d500 train` with every required seed already run says so at once: it imported the
backend's framework first (torch: 9 s under load) to run nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from d500.ledger import Ledger
from d500.paths import examples
from d500.training.seeds import required
from d500.training.submission import load


def test_nothing_left_to_run_is_said_before_the_framework_loads(tmp_path):
    entry = load(examples() / "sgd-momentum")
    with Ledger(tmp_path / "ledger.sqlite") as book:
        for seed in required(2, "digits-mlp", entry.name, "torch", 3):
            book.start_run(level=2, workload="digits-mlp", submission=entry.name,
                           backend="torch", seed=seed,
                           hyperparameters=entry.recipe.hyperparameters_logged()
                           ).finish("missed")
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, "train", "digits-mlp", "--submission",
                           "sgd-momentum"], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "D500_HOME": str(tmp_path)})
    assert done.stdout.strip() == "0 False", (done.stdout, done.stderr)
    assert "every one of its 3 required seed run(s) on torch already ran" in done.stderr
