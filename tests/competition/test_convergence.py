"""Reference convergence against real runs: the rulebook's recorded digits distributions, fresh runs
of the reference entry through the real trainer, the permutation test's p-values against a brute
enumeration, the test-vs-validation gap rule both ways, malformed blocks as one-line errors, and
`d500 reference` measuring and writing a block end to end."""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from d500 import levels
from d500.competition import convergence, reference
from d500.competition.convergence import NOT_CHECKED, OK
from d500.errors import ConfigError
from d500.ledger import Ledger
from d500.training import submission as submissions
from d500.training import workloads
from d500.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
LEVEL2 = ROOT / "levels" / "2-training"
LEVEL3 = ROOT / "levels" / "3-distributed"
MLP = LEVEL2 / "digits-mlp.yaml"
SGD = ROOT / "submissions" / "sgd-momentum"
REFERENCED = [LEVEL2 / "digits-mlp.yaml", LEVEL2 / "digits-lenet.yaml",
              LEVEL3 / "digits-mlp.yaml", LEVEL3 / "digits-lenet.yaml"]
UNREFERENCED = [LEVEL2 / "cifar10-resnet20.yaml", LEVEL2 / "mnist-lenet.yaml",
                LEVEL2 / "fashion-mnist-lenet.yaml", LEVEL3 / "cifar10-resnet20.yaml"]


def rules_of(path: Path) -> convergence.Rules:
    return convergence.read(path.read_text(encoding="utf-8"), path)


@pytest.fixture(scope="module")
def fresh_runs(tmp_path_factory) -> list:
    """The reference entry's own result on digits-mlp: the workload's `seeds` runs (seeds 0, 1,
    2: none of the reference's seeds, which start at 1000), trained for real into a ledger of
    their own."""
    home = tmp_path_factory.mktemp("fresh") / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("D500_HOME", str(home))
    try:
        wl = workloads.load(MLP)
        entry = submissions.load(SGD)
        ledger = Ledger()
        return [train(wl, entry.recipe, "torch", seed, ledger=ledger, submission=entry.name,
                      submission_files=entry.files) for seed in range(wl.seeds)]
    finally:
        mp.undo()


# -- the rulebook's references ------------------------------------------------------------------

@pytest.mark.parametrize("path", REFERENCED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_digits_workloads_carry_a_measured_reference(path):
    level = levels.of_file(path)
    level.load(path)  # the block passes the workload rules
    ref = rules_of(path).reference
    assert ref is not None and ref.metric == "epochs" and ref.backend == "torch"
    assert ref.command.startswith("d500 reference ")
    runs = int(re.search(r"--runs (\d+)", ref.command)[1])
    # 20 runs each; the samples are those that met the target (a run of sgd-momentum on
    # digits-lenet may plateau below 0.98 for all 40 epochs: the comment above says which)
    assert runs >= 20 and convergence.MIN_SAMPLES <= len(ref.samples) <= runs
    assert all(v >= 1 for v in ref.samples)
    if len(ref.samples) < runs:
        assert f"{runs - len(ref.samples)} run(s) missed the target" in path.read_text()
    assert ref.entry == ("sync" if level.number == 3 else "sgd-momentum")
    assert ref.batch_size == submissions.load(ROOT / "submissions" / ref.entry).recipe.batch_size
    assert (ref.ranks == 2) == (level.number == 3)
    wl = level.load(path)
    assert max(ref.samples) < wl.max_epochs  # every sample met the target inside the budget


@pytest.mark.parametrize("path", UNREFERENCED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_workloads_without_a_reference_are_not_checked(path):
    rules = rules_of(path)
    assert rules.reference is None
    verdict = convergence.check_epochs(rules.reference, [1.0, 1.0, 1.0])
    assert verdict.status == NOT_CHECKED and not verdict.flagged
    assert "not checked" in verdict.reason


# -- epochs to target ---------------------------------------------------------------------------

def test_a_fresh_result_of_the_reference_entry_is_not_flagged(fresh_runs):
    assert [r.status for r in fresh_runs] == ["succeeded"] * len(fresh_runs)
    epochs = [r.figures["epochs"] for r in fresh_runs]
    ref = rules_of(MLP).reference
    verdict = convergence.check_epochs(ref, epochs, batch_size=32)
    assert verdict.status == OK, verdict.reason
    assert verdict.p_value >= 0.05 and verdict.statistic == pytest.approx(sum(epochs) / 3)
    assert "exact" in verdict.test and "\n" not in verdict.reason
    for e in epochs:  # and each run on its own
        assert convergence.check_epochs(ref, [e]).status == OK


def test_implausibly_fast_epochs_are_flagged():
    ref = rules_of(MLP).reference
    fastest = min(ref.samples)
    fast = [max(fastest - 2, 1), max(fastest - 1, 1), max(fastest - 1, 1)]
    verdict = convergence.check_epochs(ref, fast, batch_size=32)
    assert verdict.flagged and verdict.p_value < 0.05, verdict.reason
    assert "implausibly fast" in verdict.reason and "sgd-momentum" in verdict.reason
    assert "missing" not in verdict.reason  # same batch as the reference
    at_16 = convergence.check_epochs(ref, fast, batch_size=16)
    assert at_16.flagged and "a reference at batch 16 is missing" in at_16.reason
    # one run: flagged only below every reference run (its lower tail 1 / (m + 1) < 0.05)
    one = convergence.check_epochs(ref, [fastest - 0.5])
    assert one.flagged and one.p_value == pytest.approx(1 / (len(ref.samples) + 1))
    assert convergence.check_epochs(ref, [fastest]).status == OK
    # many runs (Monte Carlo from a fixed seed: the same verdict every time)
    many = [fastest] * 10
    a, b = convergence.check_epochs(ref, many), convergence.check_epochs(ref, many)
    assert a.flagged == b.flagged and a.p_value == b.p_value and "Monte Carlo" in a.test
    slow = convergence.check_epochs(ref, [max(ref.samples) + 5] * 3)
    assert slow.status == OK and slow.p_value > 0.9


@pytest.mark.parametrize("result", [[4, 5, 5], [5, 6, 6], [5.5, 6.25], [7, 7, 8, 8]])
def test_the_permutation_p_value_is_the_share_of_splits_with_a_mean_at_most_the_result(result):
    samples = (5, 6, 6, 6, 7, 7, 5, 6, 8, 6, 6, 7)
    ref = convergence.Reference("epochs", "e", "torch", "d500 reference", samples)
    pooled = [*result, *samples]
    n = len(result)
    total = sum(result)
    splits = list(itertools.combinations(range(len(pooled)), n))
    at_most = sum(1 for idx in splits if sum(pooled[i] for i in idx) <= total + 1e-9)
    verdict = convergence.check_epochs(ref, result)
    assert verdict.p_value == pytest.approx(at_most / len(splits), rel=1e-12)
    assert verdict.flagged == (at_most / len(splits) < 0.05)


def test_no_runs_or_no_reference_is_not_checked_and_nonsense_is_flagged():
    ref = rules_of(MLP).reference
    assert convergence.check_epochs(ref, []).status == NOT_CHECKED
    assert convergence.check_epochs(None, [6.0]).status == NOT_CHECKED
    for bad in (math.inf, 0.0, None):
        verdict = convergence.check_epochs(ref, [6.0, bad])
        assert verdict.flagged and "not a positive finite number" in verdict.reason


# -- test accuracy against validation accuracy --------------------------------------------------

def test_real_runs_test_accuracy_is_not_far_below_validation(fresh_runs):
    rules = rules_of(MLP)
    assert (rules.validation, rules.test) == (300, 300)
    for run in fresh_runs:
        f = run.figures
        assert f["test_accuracy"] == f["final_test_accuracy"]  # a succeeded run's last eval
        verdict = convergence.check_gap(f, rules.validation, rules.test)
        assert verdict.status == OK, verdict.reason
        assert verdict.statistic == pytest.approx(f["val_accuracy"] - f["final_test_accuracy"])


def test_a_test_accuracy_far_below_validation_is_flagged(fresh_runs):
    rules = rules_of(MLP)
    f = dict(fresh_runs[0].figures)
    val = round(f["val_accuracy"] * 300)
    flagged_at = None
    for k in range(300, -1, -1):  # lower the test accuracy until the rule flags it
        f["final_test_accuracy"] = f["test_accuracy"] = k / 300
        verdict = convergence.check_gap(f, rules.validation, rules.test)
        if verdict.flagged:
            flagged_at = k
            break
        assert verdict.status == OK
    assert flagged_at is not None and flagged_at < val
    assert verdict.p_value < 0.001 and "far below validation" in verdict.reason
    assert f"far here: {flagged_at / 300:.4f} or less" in verdict.reason
    # at 300 + 300 samples "far" is a gap of several points, not the noise of one evaluation
    assert 0.04 < val / 300 - flagged_at / 300 < 0.09
    # above validation is never flagged; without figures or split sizes: not checked
    f["final_test_accuracy"] = 1.0
    assert convergence.check_gap(f, 300, 300).status == OK
    assert convergence.check_gap({"val_accuracy": 0.97}, 300, 300).status == NOT_CHECKED
    assert convergence.check_gap(f, None, 300).status == NOT_CHECKED


# -- malformed blocks ---------------------------------------------------------------------------

BLOCK = "reference_convergence: {metric: %s, entry: e, backend: torch, command: c, %s}"
TEN = "samples: [5, 5, 5, 5, 5, 5, 5, 5, 5, %s]"
BROKEN = {  # case -> (the block, what the one-line error says)
    "a list": ("reference_convergence: [5, 6]", "field 'reference_convergence' must be a mapping"),
    "missing field": ("reference_convergence: {metric: epochs, entry: e, backend: torch}",
                        "missing required field 'reference_convergence.command'"),
    "unknown key": (BLOCK % ("epochs", TEN % 5 + ", seedz: 3"),
                    "unknown field 'reference_convergence.seedz'"),
    "bad metric": (BLOCK % ("seconds", TEN % 5),
                   "field 'reference_convergence.metric' is 'seconds'"),
    "too few": (BLOCK % ("epochs", "samples: [5, 6, 7]"),
                "'reference_convergence.samples' holds 3 run(s)"),
    "not a number": (BLOCK % ("epochs", TEN % "fast"),
                     "field 'reference_convergence.samples[9]' must be a number"),
    "negative": (BLOCK % ("epochs", TEN % -1),
                 "'reference_convergence.samples[9]' must be a positive finite number"),
    "zero batch": (BLOCK % ("epochs", TEN % 5 + ", batch_size: 0"),
                   "'reference_convergence.batch_size' must be at least 1"),
}


def _broken_copy(tmp_path: Path, source: Path, block: str) -> Path:
    text = source.read_text(encoding="utf-8")
    at = text.find("\nreference_convergence:")
    text = (text[:at + 1] if at >= 0 else text) + block + "\n"
    out = tmp_path / source.parent.name / source.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_malformed_block_is_one_line_naming_the_file_and_field(tmp_path, case):
    block, expected = BROKEN[case]
    for source in (MLP, LEVEL3 / "digits-mlp.yaml"):
        path = _broken_copy(tmp_path, source, block)
        with pytest.raises(ConfigError) as err:
            levels.of_file(path).load(path)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and expected in message and "\n" not in message
        with pytest.raises(ConfigError, match="reference_convergence"):
            convergence.read(path.read_bytes(), "2-training/digits-mlp.yaml")


def test_d500_refuses_a_malformed_block_before_any_run(tmp_path):
    path = _broken_copy(tmp_path, MLP, BROKEN["too few"][0])
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "d500.cli", "reference", str(path), "--runs",
                           "10"], check=False, capture_output=True, text=True, timeout=120,
                          env={**_env(), "D500_HOME": str(home)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "reference_convergence.samples" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (home / "ledger.sqlite").exists()  # refused before the ledger was opened


# -- d500 reference, end to end -----------------------------------------------------------------

@pytest.mark.slow
def test_d500_reference_measures_records_and_writes_a_block(tmp_path, monkeypatch, capsys):
    """Ten real runs of sgd-momentum on digits-mlp with an easy target (one epoch each), through
    the command: the block it prints and writes, the runs in the ledger under their seeds."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    text = MLP.read_text(encoding="utf-8").replace("value: 0.97}", "value: 0.5}")
    text = text.split("\n# Reference convergence")[0].split("\nreference_convergence:")[0]
    path = tmp_path / "digits-mlp.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    from d500.competition import reference_cli
    assert reference_cli.main([str(path), "--runs", "10", "--first-seed", "50", "--write"]) == 0
    out = capsys.readouterr().out
    block = yaml.safe_load(out)["reference_convergence"]
    runs = Ledger().runs(workload="digits-mlp", submission="sgd-momentum")
    assert sorted(r["seed"] for r in runs) == list(range(50, 60))
    assert block["samples"] == [r["figures"]["epochs"] for r in runs]
    assert block["command"] == (f"d500 reference {path} --entry sgd-momentum --backend torch "
                                f"--runs 10 --first-seed 50")
    assert block["batch_size"] == 32 and "ranks" not in block
    assert "Wall-clock budget lifted" in out
    # the runs followed, and recorded, the rules with the wall-clock budget lifted
    for run in runs:
        followed = yaml.safe_load(run["workload_text"])
        assert followed["budget"] == {"max_epochs": 40, "max_seconds": reference.LIFTED_SECONDS}
        assert followed["target"]["value"] == 0.5
        assert f"the rules of {path}" in run["workload_text"]
    written = rules_of(path).reference
    assert written is not None and list(written.samples) == block["samples"]
    workloads.load(path)
    assert path.read_text(encoding="utf-8").startswith(text)  # the rest of the file kept
    # the same command again trains nothing: every seed's run is recorded (the block written
    # into the file since is not part of the rules compared), and the block is the same
    assert reference_cli.main([str(path), "--runs", "10", "--first-seed", "50"]) == 0
    again = capsys.readouterr()
    assert again.out == out and "10 of them recorded before" in again.err
    assert len(Ledger().runs(workload="digits-mlp", submission="sgd-momentum")) == 10


def test_a_reference_continues_from_the_runs_it_recorded_and_only_from_those(tmp_path,
                                                                              monkeypatch):
    """`d500 reference` stopped part-way picks up where it was: a seed run before under the same
    rules, entry files, backend and recipe counts (its first run, so running again never swaps
    in a luckier one); a run edited in the ledger, other rules or another recipe do not."""
    import sqlite3
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    path = tmp_path / "digits-mlp.yaml"
    path.write_text(MLP.read_text(encoding="utf-8").replace("value: 0.97}", "value: 0.5}"),
                    encoding="utf-8")
    wl, entry = workloads.load(path), submissions.load(SGD)
    m = reference.Measurement(wl, entry, "torch", None, ran=reference.lifted(wl))
    ledger = Ledger()
    assert reference.recorded(m, 50, ledger) is None
    first = reference._train(m, 50, ledger, None, None)
    assert first.status == "succeeded", first.error
    found = reference.recorded(m, 50, ledger)
    assert (found.run_id, found.status, found.figures) == (first.run_id, first.status,
                                                           first.figures)
    assert reference.recorded(m, 51, ledger) is None  # another seed
    second = reference._train(m, 50, ledger, None, None)  # --fresh: a second run of seed 50
    assert reference.recorded(m, 50, ledger).run_id == first.run_id != second.run_id
    # the attack: a recorded run's epochs edited in the ledger is not reused (its seal breaks);
    # the next one of the seed is
    with sqlite3.connect(ledger.path) as db:
        db.execute("UPDATE runs SET figures = json_set(figures, '$.epochs', 0.01) WHERE id = ?",
                   (first.run_id,))
    assert reference.recorded(m, 50, Ledger()).run_id == second.run_id
    # another recipe, other rules (a target the run never trained for): not the same runs
    assert reference.recorded(reference.Measurement(wl, entry, "torch", None, ran=m.ran,
                                                    params={"lr": 0.01}), 50, ledger) is None
    other = tmp_path / "other" / "digits-mlp.yaml"
    other.parent.mkdir()
    other.write_text(path.read_text(encoding="utf-8").replace("value: 0.5}", "value: 0.6}"),
                     encoding="utf-8")
    wl_other = workloads.load(other)
    assert reference.recorded(reference.Measurement(wl_other, entry, "torch", None,
                                                    ran=reference.lifted(wl_other)),
                              50, ledger) is None


def test_write_block_replaces_a_block_and_its_comment(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("name: w\n# a comment that stays\n# Reference convergence (old)\n# more\n"
                    "reference_convergence:\n  metric: epochs\n  samples: [1]\n\nseeds: 3\n",
                    encoding="utf-8")
    new = "# Reference convergence (new)\nreference_convergence:\n  metric: steps\n"
    reference.write_block(path, new)
    assert path.read_text(encoding="utf-8") == ("name: w\n# a comment that stays\n" + new
                                                + "seeds: 3\n")
    plain = tmp_path / "p.yaml"
    plain.write_text("name: p\nseeds: 3", encoding="utf-8")
    reference.write_block(plain, new)
    assert plain.read_text(encoding="utf-8") == "name: p\nseeds: 3\n" + new


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "D500_HOME"}


# -- a reference per precision ------------------------------------------------------------------

def _bf16_block(samples: str, extra: str = "") -> str:
    return ("reference_convergence_bf16:\n  metric: epochs\n  entry: sgd-momentum\n"
            "  backend: torch\n  command: \"d500 reference digits-mlp --precision bf16\"\n"
            f"  samples: [{samples}]\n{extra}")


def test_each_precision_has_its_own_block_and_results_meet_only_their_own(tmp_path):
    """A bf16 result is tested against the bf16 runs (`reference_convergence_bf16`), an fp32
    result against the fp32 ones: runs in one precision are no reference for another."""
    path = tmp_path / "digits-mlp.yaml"
    path.write_text(MLP.read_text(encoding="utf-8") + _bf16_block(", ".join(["12"] * 10)),
                    encoding="utf-8")
    workloads.load(path)  # the rules accept the second block
    rules = rules_of(path)
    fp32, bf16 = rules.reference, rules.reference_in("bf16")
    assert fp32 == rules_of(MLP).reference and rules.reference_in("fp16") is None
    assert bf16.precision == "bf16" and bf16.samples == (12.0,) * 10
    # 7 epochs is usual in fp32 and implausibly fast against bf16 runs that all took 12
    assert convergence.check_epochs(fp32, [7.0] * 3, precision="fp32").status == OK
    assert convergence.check_epochs(bf16, [7.0] * 3, precision="bf16").flagged
    from d500.training import score
    runs = [{"status": "succeeded", "figures": {"epochs": 7.0}, "workload_text":
             path.read_text(encoding="utf-8"), "workload_file": str(path),
             "hyperparameters": {"precision": low}} for low in ("bf16", "fp32")]
    assert score.rcp_of(runs[:1]).factor == pytest.approx(12 / 7)  # scaled to the bf16 runs
    assert score.rcp_of(runs[1:]).reference_mean == pytest.approx(
        convergence.rcp_scale(fp32, [7.0]).reference_mean)


def test_a_block_under_another_precisions_name_is_one_line(tmp_path):
    path = tmp_path / "digits-mlp.yaml"
    path.write_text(MLP.read_text(encoding="utf-8")
                    + _bf16_block(", ".join(["6"] * 10), "  precision: fp32\n"), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        workloads.load(path)
    assert str(err.value) == (f"{path}: field 'reference_convergence_bf16.precision' says fp32: "
                              f"a reference in fp32 goes under 'reference_convergence'")


def test_a_bf16_measurement_writes_its_own_block_beside_the_fp32_one(tmp_path, monkeypatch):
    """`d500 reference --precision bf16 --write`: the block is named for bf16, says so, its
    command re-measures in bf16, and the fp32 block (with its comment) stays as it was."""
    import dataclasses

    from d500.training.trainer import Result
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    path = tmp_path / "digits-mlp.yaml"
    path.write_text(MLP.read_text(encoding="utf-8"), encoding="utf-8")
    wl, entry = workloads.load(path), submissions.load(SGD)
    entry.recipe = dataclasses.replace(entry.recipe, precision="bf16")
    m = reference.Measurement(wl, entry, "torch", None, ran=reference.lifted(wl),
                              seeds=list(range(1000, 1010)),
                              results=[Result(i, "succeeded", {"epochs": 6.0 + i % 3})
                                       for i in range(10)])
    text = reference.block(m)
    assert "\nreference_convergence_bf16:\n" in text and "\n  precision: bf16\n" in text
    assert "--precision bf16" in yaml.safe_load(text)["reference_convergence_bf16"]["command"]
    before = path.read_text(encoding="utf-8")
    reference.write_block(path, text, m.precision)
    reference.write_block(path, text, m.precision)  # again: replaced, not appended twice
    after = path.read_text(encoding="utf-8")
    assert after == before + ("" if before.endswith("\n") else "\n") + text
    rules = rules_of(path)
    assert rules.reference == rules_of(MLP).reference
    assert rules.reference_in("bf16").samples == tuple(m.samples)
    # the runs' rules are the same with or without a reference block of any precision
    assert reference._rules(after) == reference._rules(MLP.read_text(encoding="utf-8"))
