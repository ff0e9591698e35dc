"""Level 3's comm_time, compute_time and comm_share: a rank's communication is a part of its step
time (aggregate refuses a rank that says otherwise), and real `mpiexec -n 2` runs of the
parameter servers (whose rank 0 drains the workers' gradients between steps) keep it so."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from d500.distributed.figures import RankStats, aggregate, timed
from tests.distributed.level3_jobs import ENTRIES, entry, last_run, train, workload

COMM = ("comm_time", "compute_time", "comm_share")


def rank(r: int, step: float, comm: float | None, steps: int = 10) -> RankStats:
    return RankStats(r, "host", 100 + r, steps=steps, step_seconds=step, comm_seconds=comm)


def test_aggregate_shares_within_the_steps():
    out = aggregate([rank(0, 2.0, 0.5), rank(1, 1.0, 1.0)])
    assert out["comm_share"] == pytest.approx(1.5 / 3.0)
    assert out["comm_time"] == pytest.approx(0.75)
    assert out["compute_time"] == pytest.approx(0.75)
    assert 0.0 <= out["comm_share"] <= 1.0


@pytest.mark.parametrize("comm", [2.2, -0.1, math.nan, math.inf, "0.1", True])
def test_aggregate_refuses_a_rank_whose_comm_is_not_part_of_its_step(comm):
    # the figures the new user saw: rank 0 said 2.2 s in collectives over 0.8 s of steps
    # (comm_share 1.41, compute_time -0.65); a rank's word, so its lie must not be recorded
    ranks = [rank(0, 0.8, comm), rank(1, 1.0, 0.5)]
    assert not timed(ranks[0]) and timed(ranks[1])
    out = aggregate(ranks)
    assert not set(COMM) & set(out), out
    assert out["step_time"] == pytest.approx((0.08 + 0.1) / 2)  # the rest stays


def test_aggregate_without_separable_comm_says_nothing_of_it():
    assert not set(COMM) & set(aggregate([rank(0, 1.0, None), rank(1, 1.0, 0.2)]))


@pytest.mark.slow
@pytest.mark.parametrize("source,options", [
    ("async-ps", None),
    ("ssp", {"staleness": 1000000}),  # never waits for a clock: only the drains between chunks
])
def test_parameter_servers_share_within_one(tmp_path: Path, source: str, options):
    """Rank 0's drain of the workers' gradients (settle, between chunks) was counted as
    communication but in no step: comm_share 1.41 for async-ps, 1.43 for ssp."""
    home = tmp_path / "home"
    wl = workload(tmp_path, "digits-mlp", budget={"max_epochs": 1})
    sub = ENTRIES / source
    if options is not None:
        dist = yaml.safe_load((sub / "submission.yaml").read_text())["distributed"]
        sub = entry(tmp_path, source, distributed={**dist, "options": options})
    out = train(home, 2, wl, sub, "--seed", "3")  # 1 epoch: it may miss the target
    run = last_run(home)
    assert run["status"] in ("succeeded", "missed"), (run["status"], out.stderr[-2000:])
    figures = run["figures"]
    assert set(COMM) <= set(figures), figures
    assert 0.0 <= figures["comm_share"] <= 1.0, figures
    assert figures["compute_time"] >= 0.0, figures
    for r in run["details"]["ranks"]:
        assert 0.0 <= r["comm_time"] <= r["step_time"] * r["steps"], r
        assert r["compute_time"] >= 0.0, r
