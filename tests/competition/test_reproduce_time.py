"""Reproduce's time comparison on hand-made figures and evaluations (a time halved disagrees, the
spread measured between repeated runs agrees, a load up to 1.25x widens the tolerance and a
heavier one leaves the times not judged, whatever load a sender fakes; another machine's
hardware is not compared), the report that says so, and the draw's odds of holding a forged
run."""

from __future__ import annotations

import itertools
import math

import pytest

from d500.competition.reproduce_time import (
    JUDGED_UP_TO,
    RATIO,
    SLACK_S,
    at_least_one,
    hardware_note,
    judged,
    latency_checks,
    not_judged,
    odds,
    odds_line,
    pooled,
    runs_for,
    slowdown,
    time_checks,
    too_fast,
    unjudged,
)

# digits-mlp seed 0 repeated on one loaded machine: time to accuracy and evaluation wall times
FAST = (0.296, [0.078, 0.117, 0.165, 0.209, 0.254, 0.296])
SLOW = (0.465, [0.117, 0.185, 0.283, 0.358, 0.42, 0.465])


def _checks(recorded, reproduced, load=1.0, scale=1.0):
    """time_checks of a recorded run (its times x scale: a forger's) against a reproduction."""
    (ta, wa), (tb, wb) = recorded, reproduced
    rows = [[37 * (i + 1), i + 1.0, w * scale, "{}", 0.0] for i, w in enumerate(wa)]
    dicts = [{"step": 37 * (i + 1), "wall_time": w} for i, w in enumerate(wb)]
    return {c.name: c for c in time_checks({"time_to_accuracy": ta * scale},
                                           {"time_to_accuracy": tb}, (rows, dicts), load)}


def test_the_spread_of_repeated_runs_agrees_either_way():
    for a, b in ((FAST, SLOW), (SLOW, FAST), (SLOW, SLOW)):
        checks = _checks(a, b)
        assert set(checks) == {"time_to_accuracy", "evaluation times"}
        assert all(c.agrees and not c.inconclusive for c in checks.values()), checks


@pytest.mark.parametrize("recorded", [FAST, SLOW])
def test_a_time_halved_everywhere_disagrees(recorded):
    checks = _checks(recorded, recorded, scale=0.5)
    assert all(not c.agrees and not c.inconclusive for c in checks.values()), checks
    tta = checks["time_to_accuracy"]
    assert tta.note == "reproduced 2.00x the recorded time"
    assert tta.tolerance == f"reproduced at most {RATIO:g}x recorded + {SLACK_S:g} s (same " \
                            "hardware)"
    assert checks["evaluation times"].note == ("reproduced 2.00x the recorded wall times (least "
                                               "squares over 6 common evaluations)")


def test_the_slowdown_is_the_jobs_demand_over_the_cores_others_left_it():
    """Others took o of n cores: a job wanting k of them had n - o, and its k ranks or threads,
    which meet at every step, all ran at once ((n - o) / k)^k of the time; a one-thread job
    beside one busy core of two is not slowed. LoadWatch's 'loaded' flag (a board's share, the
    suite's 1) plays no part."""
    two = {"usable_cores": 2, "loaded": False}
    assert slowdown({**two, "during": 1.0}, demand=1) == 1.0  # a core left: not slowed
    assert slowdown({**two, "during": 1.2}, demand=1) == 1.25  # 0.8 of its 1 core
    assert slowdown({**two, "during": 0.1}, demand=2) == 1.11  # (2 / 1.9)^2
    assert slowdown({**two, "during": 0.1}) == slowdown({**two, "during": 0.1}, demand=4)
    assert slowdown({**two, "during": 0.0}, demand=2) == 1.0
    assert judged(1.0) and judged(JUDGED_UP_TO) and not judged(1.26) and not judged(math.inf)
    # past JUDGED_UP_TO: not judged, however the record flags it
    for during, demand, load in ((1.3, 1, 1.43), (0.3, 2, 1.38), (2.0, 1, math.inf),
                                 (1.9, 2, 400.0), (1.54, 2, 18.9)):
        for loaded in (True, False):
            found = slowdown({"usable_cores": 2, "loaded": loaded, "during": during}, demand)
            assert found == load and not judged(found), (during, demand)
    # no measurement during the run: the load averages' others, wanting R cores beside it
    assert slowdown({"others": [0.1, 0.4], "usable_cores": 2}, demand=1) == 1.0
    assert slowdown({"others": [0.2, 0.1], "usable_cores": 2}, demand=2) == 1.21
    assert slowdown({"others": [3.0, 8.0], "usable_cores": 2}, demand=1) == 4.5
    assert slowdown(None) == slowdown({"others": [None], "usable_cores": 2}) == 1.0


def test_a_burst_the_averaged_cores_hide_shows_in_the_waits():
    """The rehearsal's flake: an honest level-1 latency (16.1 us a call, 1 thread) reproduced
    2.16x beside a neighbour whose cores, averaged over the window, left it one: read as quiet
    and accused. The scheduler's own count of the time its threads waited for a core shows the
    burst: waiting a share w of its runnable time, it ran 1 / (1 - w) slower; its waits count
    as far as others' CPU time explains (k threads wait for others at most k o wall / n s)."""
    two = {"usable_cores": 2, "during": 0.9, "wall": 0.25}  # others: 0.225 core-seconds
    assert slowdown(two, 1) == 1.0  # averaged: a core left to it
    burst = {**two, "waits": [0.05, 0.06], "waited": 0.545}
    assert slowdown(burst, 1) == 2.2 and not judged(2.2)
    assert slowdown({**two, "waits": [0.05, 0.3]}, 1) == 3.25  # 0.1125 s of it explained
    assert slowdown({**two, "waits": [0.05, 0.3]}, 2) == 5.5  # two threads: 0.225 s
    assert slowdown({**two, "waits": [0.2, 0.02]}, 1) == 1.1  # judged, widened by that much
    assert slowdown({**two, "waits": [0.2, 0.0]}, 1) == 1.0
    assert slowdown({**two, "waits": [0.0, 0.1]}, 1) == math.inf  # never ran
    assert slowdown({"waited": 0.5}) == 2.0  # only the share: the waits alone, uncapped
    assert slowdown({"usable_cores": 2, "during": 1.5, "waited": 0.1}, 1) == 2.0  # the larger
    assert "its threads waited for a core 55% of the time they were runnable" in unjudged(
        burst, 1)


def test_the_jobs_own_threads_queueing_widen_nothing():
    """On a quiet machine the job's threads may wait for each other (a sender's code can start
    more of them than there are cores): others' 0.05 core over 0.25 s explains 0.00625 s of
    waiting a thread, so its times stay judged at that, and a halved time disagrees."""
    quiet = {"usable_cores": 2, "during": 0.05, "wall": 0.25, "waits": [0.2, 0.3],
             "waited": 0.6}
    for demand, most in ((1, 1.03), (2, 1.06), (None, 1.06)):
        load = slowdown(quiet, demand)
        assert load == most and judged(load), (demand, load)
        assert too_fast(1.0, 2.0, load, 0.0)


def test_the_slowdown_bounds_what_was_measured_here():
    """Honest reproductions beside N = 0-4 busy loops (benchmarks/reproduce_load.py, 2 cores,
    other work at 1-minute load 7-15, 2026-11-27): (level, others' cores while it ran, its
    demand k, reproduced / recorded). Each is within RATIO x the model's slowdown (none was
    quiet enough to be judged: each is inconclusive); the level-0 ones, round trips between the
    judge and the operator's host, slowed up to 70x at o = 1.9, past a one-core bound (15x)."""
    measured = [(2, 1.51, 1, 0.67), (2, 1.73, 1, 0.88), (2, 1.92, 1, 3.68), (2, 1.93, 1, 4.43),
                (2, 1.86, 1, 3.25), (2, 1.95, 1, 9.77), (3, 1.35, 2, 0.47), (3, 1.43, 2, 0.71),
                (3, 1.54, 2, 5.85), (3, 1.36, 2, 3.95), (0, 1.42, 2, 1.74), (0, 1.75, 2, 40.82),
                (0, 1.90, 2, 70.36), (0, 1.92, 2, 44.63)]
    for level, during, k, ratio in measured:
        load = slowdown({"usable_cores": 2, "during": during}, k)
        assert ratio <= RATIO * load and not judged(load), (level, during, ratio)
    assert 70.36 > RATIO * slowdown({"usable_cores": 2, "during": 1.90}, 1)  # k = 1 would accuse


def test_no_judged_load_widens_the_tolerance_enough_to_hide_a_halved_time():
    """The attack: the sender's code leaves a process spinning outside the job's tree (others'
    load to LoadWatch) that slows nothing it times. Whatever slowdown the rule judges at, a
    time halved and reproduced at full speed is too fast, by a margin."""
    assert RATIO * JUDGED_UP_TO <= 0.95 * 2
    for tenths, waited, demand in itertools.product(range(0, 21), (None, 0.1, 0.2, 0.5),
                                                    (1, 2, None)):  # its waits too
        load = slowdown({"usable_cores": 2, "during": tenths / 10, "waited": waited,
                         "wall": 1.0, "waits": [1.0, 10 * (waited or 0)]}, demand)
        if judged(load):
            assert too_fast(1.0, 2.0, load, 0.0), (tenths, demand, load)
            long = (SLOW[0] * 10, [w * 10 for w in SLOW[1]])  # the slack resolved (4.65 s)
            assert not any(c.agrees for c in _checks(long, long, load, scale=0.5).values())


def test_too_loaded_to_judge_is_inconclusive_never_agrees():
    """A 2-rank job beside others taking 1.54 of 2 cores (measured: reproduced 5.85x its
    record): not judged, inconclusive, unless slower than even 1.5 x 18.9 explains."""
    record = {"usable_cores": 2, "during": 1.54, "loaded": True}
    load, why = slowdown(record, 2), unjudged(record, 2)
    assert why == ("times not judged: this machine was too loaded while reproducing to judge "
                   "times (other processes took 1.54 of 2 cores while it ran; the run wants 2 "
                   "core(s): it may have run 18.90x slower, and a tolerance widened beyond "
                   "1.25x would accept a halved time; only a reproduction more than (1.5x "
                   "recorded + its slack) x18.90, slower than even this load explains, "
                   "disagrees): reproduce on a quieter machine")
    slowed = (SLOW[0] * 5.85, [w * 5.85 for w in SLOW[1]])
    for scale in (1.0, 0.5, 0.25):  # honest, halved, quartered: none agrees
        checks = _checks(SLOW, slowed, load, scale)
        assert set(checks) == {"time_to_accuracy", "evaluation times"}
        assert all(c.inconclusive and not c.agrees and c.tolerance == not_judged(load, SLACK_S)
                   for c in checks.values()), checks
    assert not_judged(load, SLACK_S) == (
        "not judged: this machine was too loaded while reproducing, which may have slowed it "
        "18.90x (judged up to 1.25x); disagrees only beyond (1.5x recorded + 0.05 s) x18.90, "
        "slower than even that explains")
    checks = _checks(SLOW, slowed, load, 0.01)  # 585x: more than the load explains
    assert all(not c.agrees and not c.inconclusive for c in checks.values()), checks
    nothing_left = {"usable_cores": 2, "during": 2.0}
    assert "no core was left to it" in unjudged(nothing_left, 1)
    assert all(c.inconclusive for c in _checks(SLOW, slowed, slowdown(nothing_left, 1),
                                               0.01).values())
    found = latency_checks({"latency": 0.002, "throughput": 500.0},
                           {"latency": 0.01, "throughput": 100.0}, load)
    assert [(c.name, c.agrees, c.inconclusive) for c in found] == [
        ("latency", False, True), ("throughput", False, True)]
    found = latency_checks({"latency": 0.00002, "throughput": 50000.0},
                           {"latency": 0.01, "throughput": 100.0}, load)  # 500x
    assert [(c.name, c.agrees, c.inconclusive) for c in found] == [
        ("latency", False, False), ("throughput", False, False)]


def test_a_judged_load_widens_the_tolerance_by_that_much_only():
    load = slowdown({"usable_cores": 2, "during": 1.2}, demand=1)
    slowed = (SLOW[0] * 1.8, [w * 1.8 for w in SLOW[1]])  # within 1.5 x 1.25
    assert not all(c.agrees for c in _checks(SLOW, slowed).values())
    checks = _checks(SLOW, slowed, load=load)
    assert all(c.agrees and not c.inconclusive for c in checks.values()), checks
    assert checks["time_to_accuracy"].tolerance == (
        "reproduced at most (1.5x recorded + 0.05 s) x1.25 (same hardware; x1.25: this machine "
        "was loaded while reproducing)")
    found = latency_checks({"latency": 0.002, "throughput": 500.0},
                           {"latency": 0.0036, "throughput": 280.0}, load)
    assert all(c.agrees for c in found) and len(found) == 2
    assert not any(c.agrees for c in latency_checks({"latency": 0.001, "throughput": 1000.0},
                                                    {"latency": 0.0036, "throughput": 280.0},
                                                    load))


def test_a_recorded_time_slower_than_its_reproduction_is_not_flagged():
    assert all(c.agrees for c in _checks(SLOW, SLOW, scale=3.0).values())


def test_a_missed_run_compares_only_its_evaluations():
    rows = [[37, 1.0, 0.1, "{}", 0.0]]
    checks = time_checks({"time_to_accuracy": math.inf}, {"time_to_accuracy": math.inf},
                         (rows, [{"step": 37, "wall_time": 0.1}]))
    assert [c.name for c in checks] == ["evaluation times"] and checks[0].agrees
    assert time_checks({}, {}, ([], [])) == []


def _env(cpu: str) -> dict:
    return {"cpu": {"model": cpu, "logical_cores": 2}, "memory_bytes": 8 * 2**30, "gpus": [],
            "machine": "x86_64", "host": "a", "packages": {"torch": "2.0"}}


def test_times_are_compared_only_on_the_runs_hardware():
    same, line = hardware_note(_env("Xeon"), {**_env("Xeon"), "host": "b", "packages": {}})
    assert same and line.startswith("times compared: this machine's hardware is the run's (key ")
    same, line = hardware_note(_env("Xeon"), _env("EPYC"))
    assert not same and line.startswith("times not compared: this machine's hardware (EPYC ")
    assert "is not the run's (Xeon " in line
    assert not hardware_note(None, _env("Xeon"))[0] and not hardware_note(None, None)[0]


def test_the_odds_are_hypergeometric():
    for n, k, f in itertools.product(range(1, 8), range(0, 8), range(0, 8)):
        if k > n or f > n:
            continue
        draws = list(itertools.combinations(range(n), k))  # runs 0..f-1 are the forged ones
        hit = sum(any(i < f for i in d) for d in draws) / len(draws)
        assert at_least_one(n, k, f) == pytest.approx(hit)
    assert at_least_one(6, 2, 1) == pytest.approx(1 / 3)
    assert runs_for(6, 1) == 6 and runs_for(20, 2) == 16 and runs_for(6, 3) == 3
    assert odds(6, 2)["at_least_one_forged"][2] == pytest.approx(0.6)
    assert odds(2, 1)["runs_for_95"] == {1: 2, 2: 1}
    assert odds_line(6, 2) == (
        "a draw of 2 of 6 holds at least one forged run with probability 33% if 1 is, 60% if 2 "
        "are, 80% if 3 are forged (1 - C(N-F,K)/C(N,K)); 95% needs --runs 6 for 1, --runs 5 "
        "for 2, --runs 3 for 3")
    with pytest.raises(ValueError):
        at_least_one(3, 4, 1)


def test_reproduces_json_and_report_carry_the_odds():
    import json
    from pathlib import Path

    from d500.competition.reproduce import Reproduction, RunReport
    from d500.competition.reproduce_cli import as_json
    result = Reproduction(Path("p.tar.gz"), "0" * 64, "entry", 3, True, Path("l.sqlite"),
                          drawn_from=[1, 2, 3, 4, 5, 6],
                          runs=[RunReport(i, 2, "digits-mlp", "torch", 0) for i in (2, 5)])
    data = json.loads(json.dumps(as_json(result)))
    assert data["odds"]["drawn"] == 2 and data["odds"]["of"] == 6
    assert data["odds"]["at_least_one_forged"]["1"] == pytest.approx(1 / 3)
    assert data["odds"]["runs_for_95"] == {"1": 6, "2": 5, "3": 3}


def test_runs_too_short_for_one_slack_are_judged_together():
    """Runs of 0.2 s halved to 0.1 s: each alone is within 1.5x + 0.05 s (0.2 s); four together
    disagree (1.5 x 0.4 + 0.05 x 2 = 0.7 < 0.8), while the measured honest spread, pooled
    either way, agrees."""
    halved = [(0.1, 0.2, 1.0)] * 4
    short = ((0.1, [0.1]), (0.2, [0.2]))
    assert all(c.agrees for c in _checks(short[1], short[1], scale=0.5).values())
    together = pooled(halved)
    assert together.name == "time_to_accuracy, 4 runs summed"
    assert not together.agrees and together.note == "reproduced 2.00x the recorded time"
    assert together.tolerance == ("reproduced at most 1.5x recorded + 0.100 s (0.05 s x "
                                  "sqrt(4); same hardware)")
    honest = [(FAST[0], SLOW[0], 1.0), (SLOW[0], FAST[0], 1.0), (FAST[0], SLOW[0], 1.0)]
    assert pooled(honest).agrees
    assert pooled(halved[:1]) is None  # one run: its own check says it all
    assert pooled([(0.1, 0.2, 1.2)] * 4).agrees  # a loaded reproduction widens it
    assert not pooled([(0.1, 0.2, 1.0)] * 4).agrees
    assert pooled([(0.1, 0.2, 1.2)] * 4).tolerance == (
        "reproduced at most (1.5x recorded + 0.100 s) x1.20 (0.05 s x sqrt(4); same hardware; "
        "x1.20: this machine was loaded while reproducing)")  # as a run's own check says it


def test_the_job_wants_its_ranks_times_threads_and_an_operator_two_processes():
    from types import SimpleNamespace

    from d500.competition.reproduce import RunReport, _load
    local = {"details": {"load_average": {"usable_cores": 2, "during": 1.9}}}
    for level, world, threads, load in ((2, None, 1, 10.0), (3, 2, 1, 400.0), (0, None, 1, 400.0),
                                        (2, None, None, 400.0), (1, None, 1, 10.0)):
        prepared = SimpleNamespace(run=SimpleNamespace(level=level, world_size=world),
                                   threads=threads)
        rep = RunReport(1, level, "w", "torch", 0)
        assert _load(prepared, local, rep) == load, (level, world, threads)
        assert rep.times.startswith("; times not judged: this machine was too loaded")
    rep = RunReport(1, 2, "w", "torch", 0)
    quiet = {"details": {"load_average": {"usable_cores": 2, "during": 1.2}}}
    prepared = SimpleNamespace(run=SimpleNamespace(level=2, world_size=None), threads=1)
    assert _load(prepared, quiet, rep) == 1.25
    assert rep.times == ("; this machine was loaded while reproducing: the tolerance is widened "
                         "1.25x (at most 1.25x: a halved time still shows)")


def test_a_bench_is_judged_by_its_most_loaded_pass_and_never_without_a_record():
    """A level-1 bench's reproduction records the load beside each timed pass apart
    ("load_by_pass"): a neighbour's burst beside the latency pass alone, averaged with the
    quiet throughput pass, would read as quiet. A reproduction that recorded no load is not
    judged (it was read as quiet: the level-1 one recorded none)."""
    from types import SimpleNamespace

    from d500.competition.reproduce import RunReport, _load
    quiet = {"usable_cores": 2, "during": 0.5, "waited": 0.02}
    burst = {"usable_cores": 2, "during": 1.0, "waited": 0.54}
    prepared = SimpleNamespace(run=SimpleNamespace(level=1, world_size=None), threads=1)
    rep = RunReport(1, 1, "mlp-mnist", "onnxruntime:basic", 0)
    local = {"details": {"load_average": quiet,
                         "load_by_pass": {"latency": burst, "throughput": quiet}}}
    assert _load(prepared, local, rep) == 2.17 and not judged(2.17)
    assert "waited for a core 54% of the time" in rep.times and "2.17x slower" in rep.times
    rep = RunReport(1, 1, "mlp-mnist", "onnxruntime:basic", 0)
    assert _load(prepared, {"details": {"load_average": quiet}}, rep) == 1.02
    for details in ({}, {"load_by_pass": {}}):
        rep = RunReport(1, 1, "mlp-mnist", "onnxruntime:basic", 0)
        assert _load(prepared, {"details": details}, rep) == math.inf
        assert rep.times == ("; times not judged: the reproduction recorded no load (how busy "
                             "this machine was while it was timed)")
    [latency] = latency_checks({"latency": 1.6e-5}, {"latency": 1.6e-3}, math.inf)
    assert latency.inconclusive and not latency.agrees
    assert latency.tolerance == ("not judged: no core was left to the reproduction, or its load "
                                 "was not measured")


def test_the_report_says_plainly_that_times_were_not_judged(capsys):
    from pathlib import Path

    from d500.competition.reproduce import Reproduction, RunReport
    from d500.competition.reproduce_cli import as_json, render
    load = slowdown({"usable_cores": 2, "during": 1.9}, 1)
    run = RunReport(4, 2, "digits-mlp", "torch", 0, run_id=1)
    run.checks = list(_checks(SLOW, (SLOW[0] * 3, [w * 3 for w in SLOW[1]]), load).values())
    result = Reproduction(Path("p.tar.gz"), "0" * 64, "entry", 3, True, Path("l.sqlite"),
                          drawn_from=[4], runs=[run])
    assert run.verdict == "inconclusive" and not run.agrees and not result.agrees
    render(result)
    out = capsys.readouterr().out
    assert "inconclusive: run 4: time_to_accuracy: recorded" in out
    assert "disagrees:" not in out and "0 of 1" not in out  # read as a disagreement
    assert ("1 of 1 run(s) inconclusive (run 4: its times were not judged, this machine being "
            "too loaded while reproducing), none disagrees with the package (what") in out
    assert ("times not judged for run(s) 4: this machine was too loaded while reproducing to "
            "judge times; reproduce on a quieter machine") in out
    found = as_json(result)
    assert found["agrees"] is False and found["runs"][0]["verdict"] == "inconclusive"
    same = RunReport(5, 2, "digits-mlp", "torch", 1, run_id=2)
    same.checks = list(_checks(SLOW, SLOW, 1.0).values())
    assert same.verdict == "agrees"
    render(Reproduction(Path("p.tar.gz"), "0" * 64, "entry", 3, True, Path("l.sqlite"),
                        drawn_from=[4, 5], runs=[run, same]))
    assert "1 of 2 run(s) inconclusive (run 4: its times were not judged, this machine being " \
           "too loaded while reproducing), none disagrees with the package; the other 1 agree" \
           in " ".join(capsys.readouterr().out.split())
    assert all(c["inconclusive"] for c in found["runs"][0]["checks"])



def test_an_honest_short_run_slowed_by_load_is_not_accused():
    """The flake of test_two_drawn_runs_reproduce_and_agree: an honest digits run of 0.063 s
    reproduced 3.86x beside a load read as 2.00x, 4 ms over the rule before (1.5 x 2.00 x
    recorded + 0.05 s): called forged. A run's fixed costs (start-up, hand-offs between its
    processes), which the slack covers, are slowed by the load too, so the whole quiet
    tolerance is: (1.5 x recorded + 0.05 s) x slowdown. The short runs measured beside busy
    loops (benchmarks/reproduce_load.py --levels 2 --loads 0,1,2 --repeats 5, 2026-11-28, its
    record 0.062 s, the README's table): (recorded s, reproduced / recorded, others' cores of
    2 at 1 thread), each accused by the rule before, each within the rule now."""
    measured = [(0.063, 3.86, 1.50), (0.062, 6.28, 1.72), (0.062, 6.67, 1.72),
                (0.062, 8.10, 1.79), (0.062, 7.94, 1.78), (0.062, 7.99, 1.78)]
    for recorded, ratio, during in measured:
        load = slowdown({"usable_cores": 2, "during": during}, 1)
        reproduced = ratio * recorded
        assert not too_fast(recorded, reproduced, load), (recorded, ratio, load)
        assert reproduced > RATIO * load * recorded + SLACK_S  # the rule before accused it
        short = ((recorded, [recorded]), (reproduced, [reproduced]))
        assert not any(c.agrees or not c.inconclusive for c in _checks(
            short[0], short[1], load).values())  # not judged: inconclusive, never agreeing


def test_a_halved_time_is_still_caught_where_one_run_resolves_it():
    """The slack slowed with the load costs the attack little: a time halved and reproduced at
    full speed disagrees at every judged load for runs over 1 s (over 0.8 s by the rule
    before), on a quiet machine over 0.2 s as before; shorter ones are judged together
    (`pooled`), and a load beyond JUDGED_UP_TO never agrees."""
    for load, true in itertools.product((1.0, 1.1, 1.2, JUDGED_UP_TO), (1.01, 2.0, 30.0)):
        assert too_fast(true / 2, true, load), (load, true)
        long = (true, [true / 3, true])
        assert not any(c.agrees for c in _checks(long, long, load, scale=0.5).values())
    assert too_fast(0.105, 0.21) and not too_fast(0.1, 0.2)
    assert not too_fast(0.5, 1.0, JUDGED_UP_TO)  # (0.75 + 0.05) x 1.25 = 1.0: not resolved
    assert not pooled([(0.5, 1.0, JUDGED_UP_TO)] * 4).agrees  # together: 4 > 3.1 x 1.25
