"""A worker unlinks the named semaphores made in it before it ends: `d500 train` on torch:compiled
printed multiprocessing's resource tracker's "1 leaked semaphore" warning at every exit (one per
run: tqdm's RLock, made by torch.fx while it compiles, left behind by the worker's os._exit)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.training import entries

LOCKING = '''
import multiprocessing

from d500.training.optimizers.sgd import Momentum


class Locking(Momentum):
    """SGD with momentum that makes a multiprocessing lock, as tqdm does under torch.fx."""
    name = "locking"

    def update(self, ops, params, grads, state, lr, t):
        if not hasattr(self, "lock"):
            self.lock = multiprocessing.RLock()
        return super().update(ops, params, grads, state, lr, t)
'''


def _train(tmp_path, folder, backend: str) -> subprocess.CompletedProcess:
    """`d500 train` of `folder` on digits-mlp for one epoch (a copy of its file), one seed."""
    workload = yaml.safe_load(entries.MLP.read_text())
    workload["budget"]["max_epochs"] = 1
    (tmp_path / "digits-mlp.yaml").write_text(yaml.safe_dump(workload))
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp.yaml",
                           "--submission", str(folder), "--backend", backend, "--seeds", "1"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)


def test_a_lock_made_in_the_worker_leaks_no_semaphore(tmp_path):
    done = _train(tmp_path, entries.folder(tmp_path, LOCKING, "Locking"), "torch")
    assert done.returncode in (0, 1) and "run 1, seed" in done.stdout, done.stderr  # 1: missed
    assert "leaked semaphore" not in done.stderr, done.stderr


@pytest.mark.slow  # a cold torch:compiled compile: 30-90 s on a loaded 2-core machine
def test_torch_compiled_leaks_no_semaphore(tmp_path):
    done = _train(tmp_path, entries.SGD, "torch:compiled")
    assert done.returncode in (0, 1) and "run 1, seed" in done.stdout, done.stderr  # 1: missed
    assert "leaked semaphore" not in done.stderr, done.stderr
