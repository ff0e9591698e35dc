"""d500 check's identity step on the real digits package: a run pointed at a forged provenance
(another CPU), with or without re-sealing, is caught; runs made with another d500 commit or a
dirty tree are a warning, refused under --strict."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from d500.competition import identity
from d500.competition.check import check
from d500.competition.layout import environment_member, run_member
from d500.competition.package import Package

from .packages import repack, reseal

FORGED_CPU = "Forged CPU 9000"


def forge_environment(origin_id: int, change: Callable[[dict], None], seal: bool):
    """An edit giving one run a changed copy of its provenance (a new environments/ member named
    by its own sha256), its record pointed at it; re-sealed with d500's functions when `seal`."""
    def edit(found: dict[str, bytes]) -> None:
        name = run_member(origin_id)
        record = json.loads(found[name])
        old = environment_member(record["environment"])
        env = json.loads(found[old])
        change(env)
        text = json.dumps(env, sort_keys=True).encode()
        digest = hashlib.sha256(text).hexdigest()
        found[environment_member(digest)] = text

        def point(rec: dict) -> None:
            rec["environment"] = digest
        if seal:
            reseal(origin_id, record=point)(found)
        else:
            point(record)
            found[name] = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    return edit


def another_cpu(env: dict) -> None:
    env["cpu"]["model"] = FORGED_CPU


def test_a_swapped_environment_fails_check_sealed_or_not(digits_package, rules_dir, tmp_path):
    run = Package.open(digits_package).runs()[0].origin_id
    swapped = repack(digits_package, tmp_path / "swapped.tar.gz",
                     forge_environment(run, another_cpu, seal=False))
    problems = check(Package.open(swapped), rules_dir).problems
    assert f"integrity: run {run}: environment differ from what its seal recorded (changed " \
           "after the run)" in problems, problems
    assert any(p.startswith(f"identity: run {run}: its MLLOG's submission_platform is ")
               and f"says '{FORGED_CPU} ×" in p for p in problems), problems
    # re-sealed as a forger with d500's own functions: the seal agrees, the log does not
    resealed = repack(digits_package, tmp_path / "resealed.tar.gz",
                      forge_environment(run, another_cpu, seal=True))
    problems = check(Package.open(resealed), rules_dir).problems
    assert not [p for p in problems if p.startswith("integrity")], problems
    assert [p for p in problems if p.startswith("identity")] == [
        p for p in problems if f"'{FORGED_CPU} ×" in p] and len(problems) >= 1, problems


def another_commit(env: dict) -> None:
    env["git"] = {"commit": "0" * 40, "dirty": True}


def test_another_commit_or_a_dirty_tree_is_a_warning_refused_under_strict(
        digits_package, rules_dir, run_d500, tmp_path):
    pkg = Package.open(digits_package)
    runs = [r.origin_id for r in pkg.runs()]

    def edit(found: dict[str, bytes]) -> None:
        for run in runs:
            forge_environment(run, another_commit, seal=True)(found)
    other = repack(digits_package, tmp_path / "other.tar.gz", edit)
    report = check(Package.open(other), rules_dir)
    assert report.problems == [], report.problems
    note = (f"identity: run(s) {', '.join(map(str, runs))} were made with d500 "
            f"{pkg.runs()[0].environment['packages']['d500']} at commit 000000000000 (dirty "
            "tree); this check runs ")
    assert [n for n in report.notes if n.startswith(note)] == report.notes[:1], report.notes
    passed = run_d500(None, "check", str(other), "--rules", str(rules_dir))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert f"  warning  {note}" in passed.stdout, passed.stdout
    strict = run_d500(None, "check", str(other), "--rules", str(rules_dir), "--strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert f"{other}: strict: {note}" in strict.stdout, strict.stdout
    assert "Traceback" not in strict.stderr


def test_version_notes_compare_version_commit_and_tree():
    class Run:
        def __init__(self, origin_id: int, version: str, commit: str, dirty: bool):
            self.origin_id = origin_id
            self.environment = {"packages": {"d500": version},
                                "git": {"commit": commit, "dirty": dirty}}

    mine = ("0.1.0", "a" * 40, False)
    same = Run(1, "0.1.0", "a" * 40, False)
    assert identity.version_notes([same], mine, "0.1.0") == []
    notes = identity.version_notes(
        [same, Run(2, "0.2.0", "a" * 40, False), Run(3, "0.1.0", "b" * 40, False),
         Run(4, "0.1.0", "a" * 40, True)], mine, "0.2.0")
    assert notes == [
        "identity: run(s) 2 were made with d500 0.2.0 at commit aaaaaaaaaaaa; this check runs "
        "d500 0.1.0 at commit aaaaaaaaaaaa",
        "identity: run(s) 3 were made with d500 0.1.0 at commit bbbbbbbbbbbb; this check runs "
        "d500 0.1.0 at commit aaaaaaaaaaaa",
        "identity: run(s) 4 were made with d500 0.1.0 at commit aaaaaaaaaaaa (dirty tree), the "
        "commit this check runs, with uncommitted changes no check can see",
        "identity: the package was made by d500 0.2.0; this check runs d500 0.1.0"], notes
    # both dirty at one commit: not 'made with X (dirty tree); this check runs X (dirty tree)'
    assert identity.version_notes([Run(4, "0.1.0", "a" * 40, True)], mine[:2] + (True,)) == [
        "identity: run(s) 4 were made with d500 0.1.0 at commit aaaaaaaaaaaa (dirty tree), the "
        "commit this check runs, with uncommitted changes no check can see"]


def test_the_platform_line_is_compared_with_the_provenance_cpu(digits_package):
    run = Package.open(digits_package).runs()[0]
    assert identity.platform_problems([run]) == []
    logged = identity.logged_platform(run.mllog_text)
    assert logged is not None and logged.startswith(identity.cpu_claim(run.environment))



def test_a_package_of_old_seals_passes_imports_and_verifies_and_its_platform_is_checked(
        digits_package, rules_dir, tmp_path):
    """Runs sealed the old way (over env_id, as a d500 before the digest was sealed did) still
    pass check, import and verify; their provenance, which such a seal does not cover, is
    still held to the platform its MLLOG names."""
    from d500.ledger import Ledger

    runs = [r.origin_id for r in Package.open(digits_package).runs()]

    def old(found: dict[str, bytes]) -> None:
        for run in runs:
            reseal(run, legacy=True)(found)
    legacy = repack(digits_package, tmp_path / "legacy.tar.gz", old)
    pkg = Package.open(legacy)
    assert all("env_id" in json.loads(r.sealed) and "environment" not in json.loads(r.sealed)
               for r in pkg.runs())
    assert check(pkg, rules_dir).problems == []
    with Ledger(tmp_path / "home" / "ledger.sqlite") as book:
        done = book.import_package(legacy, rules_dir=rules_dir)
        assert (done.status, len(done.runs)) == ("imported", len(runs)), done.problems
        assert book.verify() == []
    swapped = repack(legacy, tmp_path / "swapped.tar.gz",
                     forge_environment(runs[0], another_cpu, seal=False))
    problems = check(Package.open(swapped), rules_dir).problems
    assert [p for p in problems if not p.startswith("identity")] == [], problems
    assert len(problems) == 1 and f"'{FORGED_CPU} ×" in problems[0], problems
