"""`mpiexec -n 2 d500 train ... --show-partition` prints the cut once, from rank 0: every rank
printed it, so the table came out twice (or interleaved); nothing trains either way."""

from __future__ import annotations

import pytest

from d500.cli import main

ARGS = ["train", "digits-mlp", "--submission", "pipeline-1f1b", "--show-partition"]


@pytest.mark.parametrize("rank, shown", [("0", True), ("1", False)])
def test_only_rank_0_prints_the_cut(monkeypatch, capsys, tmp_path, rank, shown):
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    monkeypatch.setenv("PMI_RANK", rank)
    monkeypatch.setenv("PMI_SIZE", "2")
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert ("imbalance (costliest stage / mean)" in out) is shown, out
    assert shown or out == ""


def test_a_declared_data_dimension_is_shown(monkeypatch, capsys, tmp_path):
    """hybrid-data-pipeline runs 2 data groups of 2 stages: the line said only its stages."""
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    assert main(["train", "digits-mlp", "--submission", "hybrid-data-pipeline",
                 "--show-partition"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "digits-mlp / hybrid-data-pipeline: 2 stages, 4 micro-batches, 1f1b, 2 data groups "
        "(4 ranks)")


def test_a_level_2_entry_trains_nothing(monkeypatch, capsys, tmp_path):
    """digits-mlp with sgd-momentum (level 2) ignored --show-partition and trained the
    workload's required seeds into the ledger; now one line says it is a level-2 workload."""
    import re
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    assert main(["train", "digits-mlp", "--submission", "sgd-momentum", "--show-partition",
                 "--debug"]) == 2
    assert re.search("shows a level-3 entry's pipeline.*level-2 workload", capsys.readouterr().err)
    assert not (tmp_path / "ledger.sqlite").exists()
