"""Level-2 rules: workload files and submissions, each bad input one ConfigError naming the file
and field; the shipped workloads and entries load; tuning draws are deterministic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from d500 import profile
from d500.errors import ConfigError
from d500.training import score, seeds, submission, tuning, workloads

ROOT = Path(__file__).resolve().parents[2]
LEVEL2 = ROOT / "levels" / "2-training"
ENTRIES = ("sgd-momentum", "nesterov", "adamw", "lars")


def test_the_shipped_workloads_and_entries_load():
    for path in sorted(LEVEL2.glob("*.yaml")):
        wl = workloads.load(path)
        if wl.text:  # a language model: log-perplexity, lower is better
            assert wl.target_metric == "val_log_perplexity" and wl.lower_is_better
        else:
            assert wl.target_metric == "val_accuracy" and 0 < wl.target <= 1
    for name in ENTRIES:
        entry = submission.load(ROOT / "submissions" / name)
        for wl_name in entry.workloads:
            entry.recipe.check(workloads.load(LEVEL2 / f"{wl_name}.yaml"))


def _workload(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


GOOD = (LEVEL2 / "digits-mlp.yaml").read_text()


@pytest.mark.parametrize("old, new, message", [
    ("target: {metric: val_accuracy, value: 0.97}", "target: {metric: test_accuracy, value: 0.97}",
     "field 'target.metric' is 'test_accuracy'; allowed: val_accuracy"),
    ("target: {metric: val_accuracy, value: 0.97}", "target: {metric: val_accuracy, value: 1.5}",
     "field 'target.value' must be an accuracy"),
    ("batch_size: {min: 8, max: 256}", "batch_size: {min: 64, max: 8}",
     "field 'batch_size' needs 1 <= min <= max"),
    ("dataset: {name: digits,", "dataset: {name: imagenet,", "field 'dataset.name' is 'imagenet'"),
    ("model: {builder: mlp}", "model: {builder: vgg}", "field 'model.builder' is 'vgg'"),
    ("evaluation: {every_epochs: 1}", "evaluation: {every_epochs: 1, every_steps: 5}",
     "field 'evaluation' needs exactly one of"),
    ("budget: {max_epochs: 40, max_seconds: 120}", "budget: {max_epochs: 0}",
     "field 'budget.max_epochs' must be at least 1"),
    ("rank_by: time_to_accuracy", "rank_by: latency", "field 'rank_by' is 'latency'"),
    ("metrics: [time_to_accuracy,", "metrics: [latency, time_to_accuracy,",
     "names 'latency', which level 2 does not measure"),
])
def test_a_bad_workload_names_the_field(tmp_path, old, new, message):
    assert old in GOOD
    path = _workload(tmp_path, GOOD.replace(old, new))
    with pytest.raises(ConfigError, match=message) as err:
        workloads.load(path)
    assert str(path) in str(err.value)


def _entry(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "entry"
    folder.mkdir(exist_ok=True)
    (folder / "submission.yaml").write_text(text)
    return folder


ENTRY = (ROOT / "submissions" / "sgd-momentum" / "submission.yaml").read_text()


@pytest.mark.parametrize("old, new, message", [
    ("optimizer: momentum", "optimizer: rmsprop", "field 'optimizer' is 'rmsprop'"),
    ("lr: {min: 0.01, max: 0.3, scale: log}", "lr: {min: 0.3, max: 0.01, scale: log}",
     "field 'search_space.lr': needs numbers min < max"),
    ("lr: {min: 0.01, max: 0.3, scale: log}", "lr: {min: 0.0, max: 0.3, scale: log}",
     "a log scale needs min > 0"),
    ("lr: {min: 0.01, max: 0.3, scale: log}", "beta9: {min: 0.1, max: 0.3}",
     "'beta9' is not a hyperparameter of optimizer 'momentum'"),
    ("momentum: {min: 0.8, max: 0.95}", "momentum: {min: 0.8, max: 1.5}",
     "hyperparameter 'momentum' must be a number in \\[0, 1\\)"),
    ("momentum: 0.9,", "momentum: -0.9,", "hyperparameter 'momentum' must be"),
    ("schedule: {name: cosine, warmup: 0.05}", "schedule: {name: exponential}",
     "field 'schedule'"),
])
def test_a_bad_submission_names_the_field(tmp_path, old, new, message):
    assert old in ENTRY
    folder = _entry(tmp_path, ENTRY.replace(old, new))
    with pytest.raises(ConfigError, match=message) as err:
        submission.load(folder)
    assert "submission.yaml" in str(err.value)


def test_a_batch_size_over_the_limit_is_refused(tmp_path):
    entry = submission.load(_entry(tmp_path, ENTRY.replace("batch_size: 32", "batch_size: 512")))
    with pytest.raises(ConfigError, match="batch_size 512 is outside the limits of workload "
                                          "'digits-mlp' \\(8 to 256\\)"):
        entry.recipe.check(workloads.load(LEVEL2 / "digits-mlp.yaml"))


def test_tuning_draws_are_quasi_random_in_range_and_repeatable():
    wl = workloads.load(LEVEL2 / "digits-mlp.yaml")
    entry = submission.load(ROOT / "submissions" / "sgd-momentum")
    first = tuning.plan(wl, entry, studies=3, trials=5)
    again = tuning.plan(wl, entry, studies=3, trials=5)
    assert [[t.params for t in s] for s in first] == [[t.params for t in s] for s in again]
    lrs = [t.params["lr"] for s in first for t in s]
    assert all(0.01 <= lr <= 0.3 for lr in lrs)
    assert len(set(lrs)) == 15  # studies draw different points
    seeds = [t.seed for s in first for t in s]
    assert len(set(seeds)) == 15  # every trial its own seed
    # Halton covers the log range evenly: both halves of log(lr) get points in each study
    for study in first:
        logs = [math.log(t.params["lr"]) for t in study]
        mid = (math.log(0.01) + math.log(0.3)) / 2
        assert any(v < mid for v in logs) and any(v > mid for v in logs)


RULES = (LEVEL2 / "digits-mlp.yaml").read_text()  # 3 seeds, studies of 5 trials


def _run(rid, study, status, tta=None, test=None, started=0.0, stopped=10.0, workload="w",
         submission_="s", backend="b", seed=None, trial=None):
    figures = {} if tta is None else {"time_to_accuracy": tta}
    if test is not None:
        figures["test_accuracy"] = test
    if seed is None and study is None:
        seed = seeds.required(2, workload, submission_, backend, 3)[0]
    return {"id": rid, "study": study, "status": status, "figures": figures,
            "workload": workload, "submission": submission_, "backend": backend,
            "started_unix": started, "stopped_unix": stopped, "seed": seed, "level": 2,
            "trial": trial, "workload_text": RULES, "workload_file": str(LEVEL2 / "w.yaml")}


def test_the_score_is_the_median_over_studies_of_each_studys_fastest_trial():
    runs = [_run(1, 1, "succeeded", 5.0, 0.9), _run(2, 1, "succeeded", 3.0, 0.95),
            _run(3, 1, "diverged"), _run(4, 2, "missed"), _run(5, 2, "failed"),
            _run(6, 3, "succeeded", 8.0, 0.8), _run(7, 3, "succeeded", 7.0, 0.85),
            _run(8, None, "succeeded", 4.0)]
    [entry] = score.entries(runs)
    assert sorted(entry.study_scores()) == [3.0, 7.0, math.inf]
    assert entry.score == 7.0  # a study that missed counts as infinity, not dropped
    assert entry.tuning_cost == 70.0  # every trial's wall time, failed ones included
    assert entry.test_quality() == pytest.approx(0.9)  # median of 0.95 and 0.85
    assert entry.counts() == {"succeeded": 4, "diverged": 1, "missed": 1, "failed": 1}
    assert [r["id"] for r in entry.seeds] == [8]


def test_only_the_required_seeds_score_and_an_interrupted_one_is_a_miss():
    """The rules' 3 seeds of (w, s, b) score; a run with a seed the sender chose is an
    exploration (listed, never scored); a required seed only interrupted counts as a miss (∞)
    until it is re-run to the end; one still running counts for nothing yet."""
    a, b, c = seeds.required(2, "w", "s", "b", 3)
    assert len({a, b, c}) == 3 and seeds.required(2, "w", "s", "b", 2) == [a, b]
    assert seeds.required(2, "w", "other", "b", 1) != [a]  # per entry (and workload, backend)
    assert seeds.required(3, "w", "s", "b", 1, 2) != seeds.required(3, "w", "s", "b", 1, 4)
    runs = [_run(1, None, "succeeded", 9.0, seed=a), _run(2, None, "succeeded", 1.0, seed=0),
            _run(3, None, "interrupted", seed=b), _run(4, None, "running", seed=c),
            _run(5, None, "succeeded", 2.0, seed=12345)]
    [entry] = score.entries(runs)
    assert [r["id"] for r in entry.seeds] == [1, 3]  # b only interrupted: a miss
    assert [score.time_to_target(r) for r in entry.seeds] == [9.0, math.inf]
    assert [r["id"] for r in entry.explorations] == [2, 5]  # the fast seeds 0 and 12345
    [again] = score.entries([*runs, _run(6, None, "succeeded", 3.0, seed=b)])
    assert [r["id"] for r in again.seeds] == [1, 6]  # re-run to the end: it counts


def test_only_trials_within_the_workloads_budget_score():
    """A study of 10 trials on a workload of 5 (d500 tune --trials 10): trials 5-9 never
    score, however fast."""
    runs = [_run(i + 1, 1, "succeeded", 10.0 - i, trial=i) for i in range(10)]
    [entry] = score.entries(runs)
    assert sorted(r["trial"] for r in entry.trials) == [0, 1, 2, 3, 4]
    assert entry.score == 6.0


def test_seed_statistics_never_report_the_best_run():
    stats = score.over_seeds([10.0, 11.0, 30.0, math.inf, 12.0])
    assert stats.median == 12.0 and stats.n == 5
    assert stats.olympic_mean == pytest.approx((11 + 12 + 30) / 3)
    lo, hi = stats.ci95
    assert lo <= 12.0 <= hi and lo >= 10.0


def test_the_performance_profile_counts_workloads_within_tau_of_the_best():
    scores = {"a": {"w1": 1.0, "w2": 6.0}, "b": {"w1": 2.0, "w2": 2.0},
              "c": {"w1": math.inf}}
    taus = profile.taus()
    rho = profile.performance_profile(scores, taus)
    at = {t: i for i, t in enumerate(taus)}
    assert rho["a"][0] == 0.5 and rho["b"][0] == 0.5  # each is best on one workload
    assert rho["a"][at[2.0]] == 0.5 and rho["b"][at[2.0]] == 1.0
    assert rho["a"][-1] == 1.0 and rho["c"][-1] == 0.0  # c missed w1, did not enter w2
    assert profile.profile_score(rho["b"], taus) > profile.profile_score(rho["a"], taus) > 0
    assert profile.profile_score([1.0] * len(taus), taus) == pytest.approx(1.0)
