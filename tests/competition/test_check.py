"""d500 check on the real digits package of the shared fixtures: the clean package passes under its
rules folder; a tampered figure, log line and workload file, a removed trial, a repeated seed and
a wrong or missing signer are each caught with a line naming them; a file that is not a package
is exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d500.competition import compliance, signing
from d500.competition.check import check, check_package
from d500.competition.package import Package
from d500.errors import D500Error
from d500.training.seeds import required

from .conftest import ENTRY
from .packages import edit_json, members, repack

TOP = "d500-package"
WORKLOAD = f"{TOP}/files/workloads/2-training/digits-mlp.yaml"


def _problems(path: Path, rules_dir: Path, trusted: list[str] = ()) -> list[str]:
    return check_package(Package.open(path), rules_dir, trusted)


def _seed_runs(path: Path) -> list[int]:
    return [r.origin_id for r in Package.open(path).runs() if r.trial is None]


def _trials(path: Path) -> dict[tuple[int, int], int]:
    """(study, trial number) -> run id."""
    return {(r.trial[0], r.trial[1]): r.origin_id for r in Package.open(path).runs()
            if r.trial is not None}


def _drop_run(run_id: int):
    """An edit that removes a run's record and MLLOG and its id from the manifest's runs."""
    def edit(found: dict[str, bytes]) -> None:
        del found[f"{TOP}/runs/{run_id}.json"]
        del found[f"{TOP}/runs/{run_id}.mllog.txt"]
        manifest = json.loads(found[f"{TOP}/manifest.json"])
        manifest["runs"].remove(run_id)
        found[f"{TOP}/manifest.json"] = json.dumps(manifest).encode()
    return edit


def test_the_clean_package_passes_under_its_rules(digits_package, rules_dir, run_d500):
    report = check(Package.open(digits_package), rules_dir)
    assert report.problems == []
    assert (report.runs, report.studies, report.seeds) == (6, 2, 2)
    assert "signature: the package is not signed" in report.not_checked
    checked = " | ".join(report.checked)
    for what in ("integrity:", "rules:", "completeness:", "logs: 6 MLLOG(s)",
                 ("convergence: 1 result(s) against reference convergence, 2 run(s) test vs "
                  "validation accuracy")):
        assert what in checked
    result = run_d500(None, "check", str(digits_package), "--rules", str(rules_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"passed: entry '{ENTRY}' (level 2), 6 run(s), 2 study(ies), 2 seed run(s)" \
        in result.stdout
    assert "not checked  signature: the package is not signed" in result.stdout
    assert result.stderr == ""


def test_d500s_own_rulebook_is_not_the_packages(digits_package, rules_dir, run_d500):
    """The fixture's rules ask 2 seeds and 2 studies of 2 trials; d500's own digits-mlp.yaml is
    another file (3 seeds, 3 studies of 5 trials): the workload file and the counts fail."""
    result = run_d500(None, "check", str(digits_package))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert all(line.startswith(f"{digits_package}: ") for line in lines)
    text = "\n".join(lines)
    assert "rules: workload file 2-training/digits-mlp.yaml differs from the rulebook's" in text
    third = required(2, "digits-mlp", ENTRY, "torch", 3)[2]
    assert (f"required seed(s) {third} (of the workload's 3) have no run: the rules choose the "
            f"seeds") in text
    assert "its tuning requires 3" in text
    assert ("records a budget of 2 studies of 2 trials; the workload's tuning is 3 studies of 5 "
            "trials") in text


def test_json_report(digits_package, rules_dir, run_d500):
    result = run_d500(None, "check", str(digits_package), "--rules", str(rules_dir), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["passed"] is True and out["problems"] == [] and out["entry"] == ENTRY
    assert (out["runs"], out["studies"], out["seed_runs"]) == (6, 2, 2)
    assert out["sha256"] == Package.open(digits_package).sha256


def test_a_tampered_figure_is_caught(digits_package, rules_dir, tmp_path):
    run = _seed_runs(digits_package)[0]

    def faster(record: dict) -> None:
        figures = json.loads(record["row"]["figures"])
        figures["time_to_accuracy"] /= 2
        record["row"]["figures"] = json.dumps(figures)

    bad = repack(digits_package, tmp_path / "figure.tar.gz",
                 edit_json(f"{TOP}/runs/{run}.json", faster))
    problems = _problems(bad, rules_dir)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"integrity: run {run}: figures differ")


def test_a_tampered_log_line_is_caught(digits_package, rules_dir, tmp_path):
    run = _seed_runs(digits_package)[0]
    name = f"{TOP}/runs/{run}.mllog.txt"

    def better(found: dict[str, bytes]) -> None:
        lines = found[name].decode().splitlines(keepends=True)
        i = next(i for i, line in enumerate(lines) if '"key": "eval_accuracy"' in line)
        lines[i] = re.sub(r'"value": [0-9.]+', '"value": 0.999', lines[i])
        found[name] = "".join(lines).encode()

    problems = _problems(repack(digits_package, tmp_path / "log.tar.gz", better), rules_dir)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"integrity: run {run}: {name} differs from the MLLOG")


def test_a_log_missing_a_required_key_fails_mlperfs_checker(digits_package, rules_dir,
                                                             tmp_path):
    run = _seed_runs(digits_package)[0]
    name = f"{TOP}/runs/{run}.mllog.txt"

    def cut(found: dict[str, bytes]) -> None:
        found[name] = b"".join(line for line in found[name].splitlines(keepends=True)
                               if b'"micro_batch_size"' not in line)

    problems = _problems(repack(digits_package, tmp_path / "cut.tar.gz", cut), rules_dir)
    assert f"logs: run {run} ({name}): Required EXACTLY_ONE occurrence of 'micro_batch_size' " \
           f"but found 0" in problems
    assert any(p.startswith(f"integrity: run {run}: {name} differs") for p in problems)


def test_a_tampered_workload_file_is_caught(digits_package, rules_dir, tmp_path):
    def easier(found: dict[str, bytes]) -> None:
        found[WORKLOAD] = re.sub(rb"(?m)^target: .*$", b"target: {metric: val_accuracy, "
                                 b"value: 0.5}", found[WORKLOAD])

    problems = _problems(repack(digits_package, tmp_path / "rules.tar.gz", easier), rules_dir)
    assert any(p.startswith("rules: workload file 2-training/digits-mlp.yaml differs from the "
                            "rulebook's") for p in problems), problems
    assert "rules: the workload text recorded by run(s) 1, 2, 3, 4, 5, 6 differs from the " \
           "packaged 2-training/digits-mlp.yaml" in problems


def test_a_removed_trial_is_a_gap(digits_package, rules_dir, tmp_path):
    trials = _trials(digits_package)
    study = min(s for s, _ in trials)
    hidden = trials[study, 1]
    bad = repack(digits_package, tmp_path / "gap.tar.gz", _drop_run(hidden))
    assert Package.open(bad).member_problems() == []  # the manifest agrees: only a gap shows
    problems = _problems(bad, rules_dir)
    where = "completeness: digits-mlp (level 2) / torch: "
    assert f"{where}study 0: trial(s) 1 of 0..1 missing (a hidden trial is a gap)" \
        in problems
    assert f"{where}1 of its 2 study(ies) hold the workload's 2 trials, finished; its tuning " \
           f"requires 2" in problems
    assert len(problems) == 2, problems


def test_a_removed_seed_run_is_a_required_seed_missing(digits_package, rules_dir, tmp_path):
    last = next(r for r in Package.open(digits_package).runs()
                if r.origin_id == max(_seed_runs(digits_package)))
    bad = repack(digits_package, tmp_path / "seed.tar.gz", _drop_run(last.origin_id))
    assert _problems(bad, rules_dir) == [(
        f"completeness: digits-mlp (level 2) / torch: required seed(s) {last.seed} (of the "
        f"workload's 2) have no run: the rules choose the seeds (`d500 train` without --seed "
        f"runs them)")]


def test_a_repeated_seed_is_caught(ledger_copy, rules_dir, entry_dir, run_d500, tmp_path):
    home = ledger_copy.parent
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    seed = required(2, "digits-mlp", ENTRY, "torch", 2)[0]
    again = run_d500(home, "train", workload, "--submission", str(entry_dir), "--seed",
                     str(seed), "--repeat", "--json")
    assert again.returncode in (0, 1), again.stderr
    run = json.loads(again.stdout)[0]["run_id"]
    assert json.loads(again.stdout)[0]["exploration"] is False  # a required seed, again
    out = tmp_path / "repeat.tar.gz"
    assert run_d500(home, "package", str(entry_dir), "--out", str(out)).returncode == 0
    first = min(r.origin_id for r in Package.open(out).runs() if r.seed == seed)
    result = run_d500(None, "check", str(out), "--rules", str(rules_dir))
    assert result.returncode == 1
    assert (f"{out}: completeness: digits-mlp (level 2) / torch: seed {seed} is used by runs "
            f"{first}, {run} (seeds must be distinct)") in result.stdout.splitlines()


def test_signatures_and_trusted_signers(digits_package, signed_package, signing_key, rules_dir,
                                        run_d500, tmp_path):
    pub = signing.pub_path(signing_key)
    ok = run_d500(None, "check", str(signed_package), "--rules", str(rules_dir),
                  "--trust", str(pub))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    key = signing.public_key(pub)
    assert f"checked  signature: valid, by trusted key {key[:16]}" in ok.stdout
    # by hex, as well as by file; and without --trust the signer is named but not required
    assert _problems(signed_package, rules_dir, [key]) == []
    assert any("signer not checked" in c for c in check(Package.open(signed_package),
                                                        rules_dir).checked)
    other = tmp_path / "other.key"
    signing.generate(other)
    wrong = run_d500(None, "check", str(signed_package), "--rules", str(rules_dir),
                     "--trust", str(signing.pub_path(other)))
    assert wrong.returncode == 1
    assert wrong.stdout.splitlines() == [(
        f"{signed_package}: integrity: signed by {key[:16]}…, which is not one of the 1 "
        f"trusted key(s)")]
    unsigned = run_d500(None, "check", str(digits_package), "--rules", str(rules_dir),
                        "--trust", str(pub))
    assert unsigned.returncode == 1
    assert unsigned.stdout.splitlines() == [(
        f"{digits_package}: integrity: the package is not signed, but --trust names the keys "
        f"to accept")]


def test_a_package_changed_after_signing_fails_its_signature(signed_package, signing_key,
                                                             rules_dir, tmp_path):
    """The manifest re-hashed after an edit: the members agree with it, the signature not."""
    def note(found: dict[str, bytes]) -> None:
        found[f"{TOP}/files/submission/NOTES.txt"] = b"added after signing\n"

    bad = repack(signed_package, tmp_path / "resigned.tar.gz", note)
    problems = _problems(bad, rules_dir, [signing.public_key(signing.pub_path(signing_key))])
    assert len(problems) == 1, problems
    assert problems[0].startswith("integrity: signature.json (key ")
    assert "does not match the manifest" in problems[0]


def test_not_a_package_and_bad_arguments_are_exit_2(tmp_path, run_d500, digits_package):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar at all")
    for args, words in [
            ((str(junk),), "not a d500 package"),
            ((str(tmp_path / "missing.tar.gz"),), "no such package file"),
            ((str(digits_package), "--rules", str(tmp_path / "nowhere")), "no such folder"),
            ((str(digits_package), "--trust", str(junk)), "not an ed25519 public key")]:
        result = run_d500(None, "check", *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1
        assert result.stderr.startswith("d500 check: error: ") and words in result.stderr


def test_compliance_holds_each_status_to_what_its_log_can_hold(digits_package, tmp_path):
    """Succeeded runs pass every 6.1.0 rule kept; the fixture's diverged (lr 1e6) and failed
    (a submission bug at step 3) trials are held to less, and pass too."""
    pkg = Package.open(digits_package)
    statuses = {r.status for r in pkg.runs()}
    assert {"succeeded", "diverged", "failed"} <= statuses
    found = members(digits_package)
    names = {k["KEY"]["NAME"] for k in compliance.rules(2) if "KEY" in k}
    assert "micro_batch_size" in names and "lowest_numerical_precision_in_attn" not in names
    assert "lowest_numerical_precision_in_comm" not in names
    assert "lowest_numerical_precision_in_comm" in {
        k["KEY"]["NAME"] for k in compliance.rules(3) if "KEY" in k}
    for run in pkg.runs():
        path = tmp_path / f"{run.origin_id}.mllog.txt"
        path.write_bytes(found[run.mllog_member])
        assert compliance.problems(path, 2, run.status) == [], run.status
        if run.status == "diverged":  # too short for the full rules
            assert compliance.problems(path, 2, "succeeded") != []


def test_a_result_faster_than_the_organisers_reference_is_flagged(digits_package, rules_dir,
                                                                   tmp_path):
    """The organiser's rulebook holds a reference measured after the entry ran (its file now
    differs from the package's): the entry's 2 seeds against 20 reference runs of 12-21 epochs
    are implausibly fast at p < 0.05."""
    import yaml
    text = (rules_dir / "2-training" / "digits-mlp.yaml").read_text()
    data = yaml.safe_load(text)
    data["reference_convergence"] = {
        "metric": "epochs", "entry": "slow-sgd", "backend": "torch", "batch_size": 32,
        "command": "d500 reference digits-mlp --entry slow-sgd --runs 20",
        "samples": [12 + i % 10 for i in range(20)]}
    organiser = tmp_path / "rules"
    (organiser / "2-training").mkdir(parents=True)
    (organiser / "2-training" / "digits-mlp.yaml").write_text(yaml.safe_dump(data))
    problems = _problems(digits_package, organiser)
    flagged = [p for p in problems if p.startswith("convergence: digits-mlp (level 2) / torch: "
                                                   "epochs to target: ")]
    assert len(flagged) == 1 and "implausibly fast" in flagged[0], problems
    assert "against the reference's 16.5 over 20 (slow-sgd on torch, batch 32)" in flagged[0]
    assert any(p.startswith("rules: workload file 2-training/digits-mlp.yaml differs")
               for p in problems)


def test_a_test_accuracy_far_below_validation_is_flagged(digits_package, rules_dir, tmp_path):
    run = _seed_runs(digits_package)[0]

    def overfit(record: dict) -> None:
        figures = json.loads(record["row"]["figures"])
        figures["final_test_accuracy"] = figures["test_accuracy"] = 0.8
        record["row"]["figures"] = json.dumps(figures)

    bad = repack(digits_package, tmp_path / "gap.tar.gz",
                 edit_json(f"{TOP}/runs/{run}.json", overfit))
    problems = _problems(bad, rules_dir)
    assert any(p.startswith(f"integrity: run {run}: figures differ") for p in problems)
    gap = [p for p in problems if p.startswith(f"convergence: run {run} (digits-mlp / torch, "
                                               f"seed ")]
    assert len(gap) == 1 and "test accuracy far below validation" in gap[0], problems


def test_level3_results_count_seeds_per_world_size_and_ranks_are_not_results(
        ledger_copy, rules_dir, entry_dir, tmp_path):
    """Level-3 runs (recorded directly, ended failed: no training needed) at 2 and 4 ranks,
    one with a rank row of another submission in its group: seeds count per world size, the
    rank row is neither a result nor a stranger, and no study is required (a level-3 workload
    has no `tuning:`; level 3 is scored on its seeds at each world size); a missing seed's line
    names the command that runs it at that world size (mpiexec -n N d500 train)."""
    import shutil

    from d500.competition.export import build
    from d500.ledger import Ledger
    from d500.paths import rulebook
    rules = tmp_path / "rules"
    shutil.copytree(rules_dir, rules)
    (rules / "3-distributed").mkdir()
    workload = rules / "3-distributed" / "digits-mlp.yaml"
    shutil.copy(rulebook() / "3-distributed" / "digits-mlp.yaml", workload)
    common = {"level": 3, "workload": "digits-mlp", "backend": "torch",
              "workload_file": workload}
    at = {ranks: required(3, "digits-mlp", ENTRY, "torch", 3, ranks) for ranks in (2, 4)}
    with Ledger(ledger_copy) as book:
        for seed, ranks, group in [(at[2][0], 2, "g1"), (at[2][1], 2, "g2"), (at[4][0], 4, "g3")]:
            with book.start_run(submission=ENTRY, seed=seed, group=group, rank=0,
                                world_size=ranks, **common) as run:
                run.finish("failed", error="a level-3 run cut short")
        with book.start_run(submission="rank-helper", seed=0, group="g1", rank=1,
                            world_size=2, **common) as helper:
            helper.finish("failed", error="its rank 0 failed")
    pkg = Package.open(build(entry_dir, tmp_path / "l3.tar.gz", ledger_copy))
    assert helper.id in {r.origin_id for r in pkg.runs()}
    report = check(pkg, rules)
    where = "completeness: digits-mlp (level 3) / torch"
    assert report.problems == [  # the required seeds are per world size
        f"{where} x2 ranks: required seed(s) {at[2][2]} (of the workload's 3) have no run: the "
        f"rules choose the seeds (`mpiexec -n 2 d500 train` without --seed runs them)",
        f"{where} x4 ranks: required seed(s) {at[4][1]}, {at[4][2]} (of the workload's 3) have "
        f"no run: the rules choose the seeds (`mpiexec -n 4 d500 train` without --seed runs "
        f"them)"]
    assert report.seeds == 5  # the level-2 seeds 0 and 1, and three level-3 runs


def test_studies_are_required_where_the_workloads_level_has_tuning():
    """A level-2 file's `tuning:` (its schema's 3 x 5 when absent) sets the studies; a level-3
    file has none and requires no study; `tuning:` in a level-3 file is one line naming it."""
    from d500.competition.completeness import Requirement, requirement
    from d500.errors import ConfigError
    from d500.paths import rulebook
    level2 = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    level3 = (rulebook() / "3-distributed" / "digits-mlp.yaml").read_text()
    assert requirement(level2.encode(), "2.yaml") == Requirement(3, 3, 5)
    changed = level2.replace("tuning: {studies: 3, trials: 5, seed: 0}", "tuning: {trials: 2}")
    assert requirement(changed.encode(), "2.yaml") == Requirement(3, 3, 2)
    untuned = re.sub(r"(?m)^tuning:.*\n", "", level2)
    assert "tuning" not in untuned and requirement(untuned.encode(), "2.yaml") == \
        Requirement(3, 3, 5)
    assert requirement(level3.encode(), "3.yaml") == Requirement(3, 0, 0)
    with pytest.raises(ConfigError, match=r"^3.yaml: field 'tuning' is not allowed at level 3 "):
        requirement((level3 + "tuning: {studies: 1, trials: 1, seed: 0}\n").encode(), "3.yaml")
    with pytest.raises(ConfigError, match=r"^2.yaml: field 'tuning.studies' must be at least 1$"):
        requirement(changed.replace("{trials: 2}", "{studies: 0}").encode(), "2.yaml")


def test_a_workload_file_outside_the_package_is_never_read(digits_package, rules_dir, tmp_path):
    """The record's workload_file is not sealed: one naming a file outside the package (here
    one whose YAML would not parse) is a problem line, and that file is not read."""
    secret = tmp_path / "secret.yaml"
    secret.write_text("seeds: [never closed\n")
    run = _seed_runs(digits_package)[0]
    bad = repack(digits_package, tmp_path / "outside.tar.gz", edit_json(
        f"{TOP}/runs/{run}.json",
        lambda r: r.update(workload_file=f"{TOP}/files/workloads/{secret}")))
    problems = _problems(bad, rules_dir)
    assert f"rules: run {run}: its record's workload_file " in "\n".join(problems), problems
    assert not [p for p in problems if "never closed" in p or "YAML" in p or "yaml:" in p]
    assert not [p for p in problems if p.startswith(("completeness", "convergence"))], problems
    from d500.competition.check import Context
    ctx = Context(Package.open(digits_package), [], [], rules_dir / "2-training", ())
    assert ctx.rulebook_text(f"../../{secret.name}") is None
    assert ctx.rulebook_text(str(secret)) is None
    assert ctx.rulebook_text("digits-mlp.yaml") is not None


@pytest.mark.parametrize("member, change, field", [
    ("seed", lambda r: r["row"].update(seed=[1]), "row.seed"),
    ("seed", lambda r: r["row"].update(workload_text=5), "row.workload_text"),
    ("seed", lambda r: r["row"].update(figures="[1, 2]"), "row.figures"),
    ("seed", lambda r: r["row"].update(submission_files="[]"), "row.submission_files"),
    ("seed", lambda r: r["row"].update(level="2"), "row.level"),
    ("seed", lambda r: r["evaluations"].__setitem__(0, r["evaluations"][0][:2]), "evaluations"),
    ("seed", lambda r: r["artifacts"].__setitem__(0, [1, 2, 3]), "artifacts"),
    ("trial", lambda r: r["trial"].__setitem__(1, "x"), "trial"),
])
def test_malformed_record_values_are_one_integrity_line(digits_package, rules_dir, tmp_path,
                                                        member, change, field):
    run = _seed_runs(digits_package)[0] if member == "seed" else min(_trials(digits_package)
                                                                       .values())
    bad = repack(digits_package, tmp_path / "malformed.tar.gz",
                 edit_json(f"{TOP}/runs/{run}.json", change))
    with pytest.raises(D500Error) as err:
        Package.open(bad).runs()
    assert f"runs/{run}.json: malformed field(s) {field}" in str(err.value)
    problems = _problems(bad, rules_dir)
    assert problems == [f"integrity: {err.value}"], problems


def test_malformed_record_check_exit_1_and_import_refuses(digits_package, rules_dir, tmp_path,
                                                          run_d500):
    run = _seed_runs(digits_package)[0]
    bad = repack(digits_package, tmp_path / "seed.tar.gz",
                 edit_json(f"{TOP}/runs/{run}.json", lambda r: r["row"].update(seed=[1])))
    checked = run_d500(None, "check", str(bad), "--rules", str(rules_dir))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "malformed field(s) row.seed" in checked.stdout and "Traceback" not in checked.stderr
    home = tmp_path / "home"
    imported = run_d500(home, "ledger", "--ledger", str(home / "ledger.sqlite"), "import",
                        str(bad), "--rules", str(rules_dir))
    out = imported.stdout + imported.stderr
    assert imported.returncode == 1 and "Traceback" not in out, out
    assert "malformed field(s) row.seed" in out


def test_a_changed_submission_file_is_an_integrity_problem(digits_package, rules_dir, tmp_path):
    """The manifest re-hashed over a changed submission file: no run used that content."""
    def change(found: dict[str, bytes]) -> None:
        found[f"{TOP}/files/submission/guarded.py"] += b"# changed\n"
    bad = repack(digits_package, tmp_path / "changed.tar.gz", change)
    problems = _problems(bad, rules_dir)
    assert problems and all(p.startswith("integrity: run ") and "submission file" in p
                            and "guarded.py" in p for p in problems), problems
    assert len(problems) == len(Package.open(bad).runs())


@pytest.mark.parametrize("line, message", [
    ("tuning: 5", "field 'tuning' must be a mapping, got int"),
    ("tuning: [1]", "field 'tuning' must be a mapping, got list"),
    ("tuning: {studies: 2, trails: 2}", "unknown field 'tuning.trails'"),
    ("tuning: {studies: two}", "field 'tuning.studies' must be an integer, got str 'two'"),
    ("seeds: true", "field 'seeds' must be an integer, got a boolean"),
    ("seeds: 0", "field 'seeds' must be at least 1"),
])
def test_a_bad_seeds_or_tuning_field_is_one_line_naming_file_and_field(line, message):
    """The workload text loaded by its level's own loader: a bad value is a ConfigError naming
    the file and the field, never a TypeError from reading it."""
    from d500.competition.completeness import requirement
    from d500.errors import ConfigError
    from d500.paths import rulebook
    text = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    field = line.split(":")[0]
    text, n = re.subn(rf"(?m)^{field}:.*$", line, text)
    assert n == 1
    with pytest.raises(ConfigError) as err:
        requirement(text.encode(), "2-training/digits-mlp.yaml")
    assert str(err.value).startswith(f"2-training/digits-mlp.yaml: {message}"), err.value


def test_a_senders_own_workload_copy_with_a_bad_tuning_is_one_completeness_line(
        digits_package, rules_dir, tmp_path, run_d500):
    """The rulebook lacks the workload, so the checker reads the package's own copy, which the
    sender wrote with `tuning: 5`: one completeness line naming the packaged file and the field
    (beside the integrity and rules lines saying the copy is not what the runs sealed nor the
    rulebook's), exit 1, no traceback."""
    empty = tmp_path / "rules"
    (empty / "2-training").mkdir(parents=True)

    def bad_tuning(found: dict[str, bytes]) -> None:
        found[WORKLOAD], n = re.subn(rb"(?m)^tuning:.*$", b"tuning: 5", found[WORKLOAD])
        assert n == 1

    bad = repack(digits_package, tmp_path / "tuning.tar.gz", bad_tuning)
    problems = _problems(bad, empty)
    assert [p for p in problems if p.startswith("completeness:")] == [
        "completeness: 2-training/digits-mlp.yaml: field 'tuning' must be a mapping, got int"]
    assert any(p.startswith("rules:") for p in problems), problems
    result = run_d500(None, "check", str(bad), "--rules", str(empty))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "field 'tuning' must be a mapping, got int" in result.stdout


def test_the_rulebooks_workload_is_named_by_its_path_in_the_rules_folder(rules_dir, tmp_path):
    """A workload the rules folder holds is loaded (and named) as that file: a bad field names
    its path there."""
    from d500.competition.completeness import Requirement, requirement
    from d500.errors import ConfigError
    rel = "2-training/digits-mlp.yaml"
    text = (rules_dir / rel).read_bytes()
    assert requirement(text, rel, rules_dir) == Requirement(2, 2, 2)
    rules = tmp_path / "rules"
    (rules / "2-training").mkdir(parents=True)
    (rules / rel).write_bytes(text.replace(b"seeds: 2", b"seeds: -1"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(rules / rel))}: field 'seeds' must "
                                          r"be at least 1$"):
        requirement((rules / rel).read_bytes(), rel, rules)
