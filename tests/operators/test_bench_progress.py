"""`d500 op bench` says what it is doing on a terminal's stderr while a case runs (validating,
preparing each backend, timing them interleaved: ~30 s at load 6 with nothing shown before),
its results on stdout untouched (where stderr is no terminal it says nothing: d500.progress,
tests/test_leaderboard_progress.py)."""

from __future__ import annotations

import os

from tests.test_leaderboard_progress import _run


def test_op_bench_shows_its_steps_on_a_terminal(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    args = ["op", "bench", "tests/operators/ops/numpy_ops.py:Sigmoid", "--case",
            "levels/0-operators/sigmoid-2d.yaml", "--backends", "reference", "--budget", "0.2"]
    code, out, err = _run(args, env, True)
    assert code == 0 and "sigmoid-2d" in out and "\x1b" not in out, (out, err)
    for step in ("d500 op bench: loading the frameworks", "sigmoid-2d: validating Sigmoid",
                 "sigmoid-2d: preparing reference",
                 "sigmoid-2d: timing 2 implementation(s) interleaved, 0.2 s each",
                 "sigmoid-2d: recomputing sampled calls"):
        assert step in err, err
