"""MLPerf's M > N seed runs (d500.training.window, d500.training.seeds.sort_out): which N
consecutive runs in the rules' seed order score, on hand-made figures: ties, infinities, missing
runs, M = N, and an order that is the rules', never the sender's (start times, ids, the order
the seeds were launched in move nothing)."""

from __future__ import annotations

import math

import pytest

from d500.training import seeds
from d500.training.window import choose, distance

INF = math.inf


def test_m_equal_n_scores_every_run():
    c = choose([3.0, 1.0, 2.0], 3)
    assert (c.start, c.n, c.mean, c.median) == (0, 3, 2.0, 2.0)
    assert "all 3 run(s) score" in c.reason


def test_the_window_closest_to_the_median_of_the_m():
    # median of [5, 1, 1, 9, 2, 2] is 2; window means 2.33, 3.67, 4, 4.33: the first is closest
    c = choose([5, 1, 1, 9, 2, 2], 3)
    assert (c.start, c.median) == (0, 2.0) and c.mean == pytest.approx(7 / 3)
    assert [i for i in range(6) if c.picks(i)] == [0, 1, 2]
    # not the fastest window (that would be a best-of-several): [2, 2] beats [1, 9] and [5, 1]
    assert choose([5, 1, 9, 2, 2, 1], 2).start == 3  # median 2: window [2, 2]


def test_ties_go_to_the_earliest_window():
    c = choose([1, 3, 1, 3], 2)  # every window's mean is 2, the median 2
    assert c.start == 0 and "ties: the earliest" in c.reason
    assert choose([3, 1, 3, 1, 2, 2], 2).start == 0


def test_a_miss_is_infinitely_slow():
    # median of [1, inf, 2, 3] = 2.5; windows [1, inf] and [inf, 2] are infinite: [2, 3] scores
    c = choose([1, INF, 2, 3], 2)
    assert (c.start, c.mean, c.median) == (2, 2.5, 2.5)
    # most runs missed: the median is infinite and so is the window that scores (a miss)
    c = choose([INF, 1, INF, INF], 2)
    assert c.start == 0 and math.isinf(c.mean) and math.isinf(c.median)
    assert distance(INF, INF) == 0.0 and distance(1.0, INF) == INF


def test_a_required_seed_never_run_is_infinite_in_the_median():
    # 3 of M = 5 ran: the median of [1, 2, 3, inf, inf] is 3, so [2, 3] is closest, not [1, 2]
    assert choose([1, 2, 3], 2, m=5).start == 1
    assert choose([1, 2, 3], 2).start == 0  # the same runs with M = 3: median 2, tie -> earliest
    with pytest.raises(ValueError):
        choose([1.0], 0)


TEXT = """\
level: 2
name: digits-mlp
model: {builder: mlp, input_shape: [64], hidden: [32], classes: 10}
dataset: {name: digits, train: 1197, validation: 300, test: 300, split_seed: 0}
batch_size: {min: 8, max: 256}
target: {metric: val_accuracy, value: 0.9}
budget: {max_epochs: 5, max_seconds: 60}
seeds: 2
seed_runs: 4
"""


def rows(times: list[float], started: list[float]) -> list[dict]:
    """Ledger-shaped rows of the 4 required seeds, ids 1..4, with these times and start times."""
    req = seeds.required(2, "digits-mlp", "e", "torch", 4)
    return [{"id": i + 1, "seed": s, "status": "succeeded" if math.isfinite(t) else "missed",
             "figures": {} if math.isinf(t) else {"time_to_accuracy": t},
             "started_unix": at, "level": 2, "workload": "digits-mlp", "submission": "e",
             "backend": "torch", "workload_text": TEXT, "workload_file": "digits-mlp.yaml"}
            for i, (s, t, at) in enumerate(zip(req, times, started))]


def test_sort_out_scores_the_window_in_the_rules_seed_order():
    assert (seeds.count(TEXT), seeds.scoring(TEXT)) == (4, 2)
    # seed order 1, 2, 3, 4; times 10, 1, 3, 4: median 3.5, windows 5.5, 2, 3.5 -> runs 3, 4
    out = seeds.sort_out(rows([10, 1, 3, 4], [100, 200, 300, 400]))
    assert [r["id"] for r in out.scored] == [3, 4] and [r["id"] for r in out.unscored] == [1, 2]
    assert out.choice is not None and out.choice.start == 2


def test_start_times_and_ids_move_no_run_in_the_window():
    # times 4, 1, 10, 3 in seed order: median 3.5, windows 2.5, 5.5, 6.5 -> seeds 0, 1 (mean 2.5)
    honest = seeds.sort_out(rows([4, 1, 10, 3], [100, 100.4, 100.8, 101.2]))
    assert [r["seed"] for r in honest.scored] == seeds.required(2, "digits-mlp", "e", "torch",
                                                                4)[:2]
    # the attack: seeds 1 and 2 re-dated (with their MLLOGs) to swap places within a second. A
    # launch order by start time would read 4, 10, 1, 3: windows 7, 5.5, 2, of which 2 is the
    # closest to the median 3.5: seeds 2, 3 would score, a mean of 2 for the honest 2.5
    swapped = rows([4, 1, 10, 3], [100, 100.8, 100.4, 101.2])
    by_time = sorted(swapped, key=lambda r: r["started_unix"])
    assert choose([r["figures"]["time_to_accuracy"] for r in by_time], 2, 4).mean == 2.0
    assert [r["seed"] for r in seeds.sort_out(swapped).scored] == \
        [r["seed"] for r in honest.scored]
    # the ids renumbered (a re-sealed ledger), or the seeds launched one at a time in the
    # sender's order (`--seed`, after seeing the first times): the same window
    renumbered = [{**r, "id": 10 - r["id"]} for r in rows([4, 1, 10, 3], [4, 3, 2, 1])]
    assert sorted(r["seed"] for r in seeds.sort_out(renumbered).scored) == \
        sorted(r["seed"] for r in honest.scored)
    assert seeds.sort_out(renumbered).choice.mean == honest.choice.mean == 2.5
    # a miss counts as infinitely slow, and a run of a seed the rules did not choose never scores
    extra = {**rows([1], [50])[0], "id": 9, "seed": 123456}
    out = seeds.sort_out(rows([INF, 2, 3, INF], [1, 2, 3, 4]) + [extra])
    assert [r["id"] for r in out.explorations] == [9]
    # half of the M missed: the median is ∞, so an infinite window scores (the result is a miss,
    # as MLPerf's "the entire result is invalid"), the earliest of the two: runs 1, 2, not 2, 3
    assert [r["id"] for r in out.scored] == [1, 2] and math.isinf(out.choice.mean)
    out = seeds.sort_out(rows([INF, 2, 3, 4], [1, 2, 3, 4]))  # median 3.5: [3, 4] scores
    assert [r["id"] for r in out.scored] == [3, 4]


def test_sort_out_with_m_equal_n_is_what_it_was():
    text = TEXT.replace("seed_runs: 4\n", "")
    assert (seeds.count(text), seeds.scoring(text)) == (2, 2)
    runs = [{**r, "workload_text": text} for r in rows([10, 1], [1, 2])[:2]]
    runs = [{**r, "seed": s} for r, s in zip(runs, seeds.required(2, "digits-mlp", "e",
                                                                    "torch", 2))]
    out = seeds.sort_out(runs)
    assert [r["id"] for r in out.scored] == [1, 2] and out.choice is None and not out.unscored


def test_seed_runs_below_seeds_is_one_line_naming_the_file_and_field(tmp_path):
    from d500.errors import ConfigError
    from d500.paths import rulebook
    from d500.training import workloads
    text = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    path = tmp_path / "digits-mlp.yaml"
    loaded = workloads.load(path, text=text.replace("seeds: 3", "seeds: 3\nseed_runs: 5"))
    assert (loaded.seeds, loaded.seed_runs) == (3, 5)
    assert workloads.load(path, text=text).seed_runs == 3  # absent: M = N, as before
    with pytest.raises(ConfigError, match=r"digits-mlp.yaml: field 'seed_runs' \(2\) must be at "
                                          r"least 'seeds' \(3\)"):
        workloads.load(path, text=text.replace("seeds: 3", "seeds: 3\nseed_runs: 2"))
