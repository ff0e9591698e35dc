"""MLPerf's RCP normalization (d500.competition.convergence.rcp_scale, d500.training.score.scaled)
on hand-made figures: a result faster than the reference's olympic mean epochs has its time
multiplied by reference mean / its mean; a slower one, a miss or another precision keeps 1."""

from __future__ import annotations

import math

import pytest

from d500.competition import convergence
from d500.training import score

REF = convergence.Reference("epochs", "sgd-momentum", "torch", "d500 reference ...",
                            (8.0,) * 10 + (6.0, 10.0), batch_size=32)  # olympic mean 8


def test_faster_than_the_reference_is_scaled_to_it():
    scale = convergence.rcp_scale(REF, [6, 7, 8])  # olympic mean 7
    assert scale.factor == pytest.approx(8 / 7)
    assert (scale.reference_mean, scale.result_mean) == (8.0, 7.0)
    assert "score x 1.143" in scale.reason and "MLPerf" in scale.reason
    assert convergence.rcp_scale(REF, [6]).factor == pytest.approx(8 / 6)  # one run: its value


def test_at_or_above_the_reference_is_not_scaled():
    assert convergence.rcp_scale(REF, [8, 9, 10]).factor == 1.0
    assert convergence.rcp_scale(REF, [7, 8, 9]).factor == 1.0  # exactly the mean: 1
    assert "not scaled" in convergence.rcp_scale(REF, [8, 9, 10]).reason


def test_a_miss_is_dropped_as_the_worst_or_keeps_the_result_infinite():
    # olympic: [6, 7, inf] drops 6 and inf -> 7: scaled as MLPerf's olympic epochs are
    assert convergence.rcp_scale(REF, [6, math.inf, 7]).factor == pytest.approx(8 / 7)
    assert convergence.rcp_scale(REF, [math.inf, math.inf, 7]).factor == 1.0
    assert convergence.rcp_scale(REF, [None, None]).factor == 1.0


def test_no_reference_or_another_precision_is_not_scaled():
    assert convergence.rcp_scale(None, [1, 1, 1]).factor == 1.0
    assert convergence.rcp_scale(REF, [1, 1, 1], precision="bf16").factor == 1.0


def test_a_flagged_result_is_scaled_all_the_same():
    verdict = convergence.check_epochs(REF, [2, 2, 2])
    assert verdict.flagged
    scale = convergence.rcp_scale(REF, [2, 2, 2], verdict=verdict)
    assert scale.factor == 4.0 and "flagged" in scale.reason


TEXT = """\
level: 2
name: digits-mlp
reference_convergence:
  metric: epochs
  entry: sgd-momentum
  backend: torch
  command: d500 reference digits-mlp
  samples: [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 6, 10]
"""


def test_the_ranked_time_of_a_lucky_fast_result_is_what_the_reference_epochs_would_take():
    """The attack: two runs converge in 4 epochs where the reference needs 8 (olympic). Their
    time on the board is doubled: per epoch the same, at the reference's epochs."""
    runs = [{"id": i, "status": "succeeded", "workload_text": TEXT,
             "workload_file": "digits-mlp.yaml", "hyperparameters": {},
             "figures": {"time_to_accuracy": t, "epochs": 4}} for i, t in ((1, 2.0), (2, 3.0))]
    assert score.rcp_of(runs).factor == 2.0
    assert [r["figures"]["time_to_accuracy"] for r in score.scaled(runs)] == [4.0, 6.0]
    assert [r["figures"]["time_to_accuracy"] for r in runs] == [2.0, 3.0]  # rows untouched
    slow = [{**r, "figures": {**r["figures"], "epochs": 9}} for r in runs]
    assert score.scaled(slow) is slow
