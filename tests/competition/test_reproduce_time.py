"""Reproduce's time comparison on hand-made figures and evaluations (a time halved disagrees, the
spread measured between repeated runs agrees, a loaded machine widens the tolerance, another
machine's hardware is not compared) and the draw's odds of holding a forged run."""

from __future__ import annotations

import itertools
import math

import pytest

from d500.competition.reproduce_time import (
    RATIO,
    SLACK_S,
    at_least_one,
    hardware_note,
    odds,
    odds_line,
    pooled,
    runs_for,
    slowdown,
    time_checks,
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


def test_on_a_loaded_machine_the_tolerance_widens_by_the_load():
    record = {"others": [0.3, 1.8], "usable_cores": 2, "loaded": True}
    assert slowdown(record) == pytest.approx(1.9)
    assert slowdown({**record, "loaded": False}) == 1.0  # below LoadWatch's threshold
    assert slowdown(None) == slowdown({"others": [None], "usable_cores": 2, "loaded": True}) == 1
    slowed = (SLOW[0] * 1.69, [w * 1.69 for w in SLOW[1]])  # measured: 1.69x, others 1.8 / 2
    assert not all(c.agrees for c in _checks(SLOW, slowed).values())
    checks = _checks(SLOW, slowed, load=slowdown(record))
    assert all(c.agrees and not c.inconclusive for c in checks.values()), checks
    assert checks["time_to_accuracy"].tolerance == (
        "reproduced at most 1.5x1.90 recorded + 0.05 s (same hardware; x1.90: this machine was "
        "loaded while reproducing)")
    assert all(c.agrees for c in _checks(SLOW, SLOW, load=1.9, scale=0.5).values())  # hidden


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
    assert pooled([(0.1, 0.2, 1.9)] * 4).agrees  # a loaded reproduction widens it
    assert pooled([(0.1, 0.2, 1.9)] * 4).tolerance == (
        "reproduced at most 1.5x1.90 recorded + 0.100 s (0.05 s x sqrt(4); same hardware; "
        "x1.90: this machine was loaded while reproducing)")  # as a run's own check says it
