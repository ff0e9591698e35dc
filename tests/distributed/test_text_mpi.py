"""Level 3 on text: a tiny copy of levels/3-distributed/text-lm.yaml (the real python-stdlib corpus
and byte-level BPE, a 1-layer transformer) trained by `mpiexec -n 2 d500 train` under the judge:
validation log-perplexity is the stop rule (lower is better), test log-perplexity is recorded and
the level-3 board's test column shows it in nats, not as an accuracy."""

from __future__ import annotations

import math

import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]


def test_a_text_lm_trains_data_parallel_to_a_log_perplexity_target(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(
        tmp_path, "text-lm", budget={"max_epochs": 2, "max_seconds": 300},
        model={"builder": "transformer", "layers": 1, "width": 16, "heads": 2, "tied": True},
        dataset={"name": "python-stdlib", "train": 10, "validation": 2, "test": 2,
                 "split_seed": 3, "context": 16, "vocab": 300, "tokens_sha256": None},
        evaluation={"every_steps": 10}, target={"metric": "val_log_perplexity", "value": 5.3})
    out = jobs.train(home, 2, wl, jobs.ENTRIES / "sync-adamw", "--seeds", "1",
                   timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    run = Ledger(home / "ledger.sqlite").runs(level=3)[-1]
    assert run["status"] == "succeeded", run["error"]
    f = run["figures"]
    assert f["val_log_perplexity"] <= 5.3 < math.log(300)  # met from uniform (5.70) downwards
    assert f["test_perplexity"] == pytest.approx(math.exp(f["test_log_perplexity"]))
    assert "test_accuracy" not in f and f["bytes_per_step"] > 0
    board = jobs.plain_d500(home, "leaderboard", "--level", "3")
    assert board.returncode == 0, board.stderr
    row = next(x for x in board.stdout.splitlines() if "sync-adamw" in x and "nats" in x)
    assert f"{f['test_log_perplexity']:.4f} nats" in row
