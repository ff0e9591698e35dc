"""A sender's MLLOG larger than a run writes (a 1 MB package whose log unpacks to 250 MiB took
`d500 check` 291 s and 2.97 GB) is refused by check and import before anything parses it."""

from __future__ import annotations

import time

import pytest

from d500.competition import package as package_module
from d500.competition.check import check
from d500.competition.layout import MAX_LOG_LINES, mllog_member
from d500.competition.package import Package
from d500.errors import D500Error

from .packages import forge_log, repack


def _seed_run(path) -> int:
    return next(r.origin_id for r in Package.open(path).runs() if r.trial is None)


def test_an_mllog_of_16_mib_is_refused_before_it_is_parsed(digits_package, rules_dir, run_d500,
                                                           tmp_path):
    """Its last line repeated to 16 MiB (gzip'd to a fraction of a MiB), the run re-sealed with
    the log's new hash: check names the package, the run and the member in one line, reads no
    run further, and ends in a fraction of a second (20 MiB took 11 s before); import refuses it."""
    rid = _seed_run(digits_package)

    def grown(text: str) -> str:
        last = text.splitlines(keepends=True)[-1]
        return text + last * ((16 << 20) // len(last))
    bomb = repack(digits_package, tmp_path / "bomb.tar.gz", forge_log(rid, grown))
    assert bomb.stat().st_size < (4 << 20)
    began = time.perf_counter()
    report = check(Package.open(bomb), rules_dir)
    took = time.perf_counter() - began
    member = mllog_member(rid)
    assert [p for p in report.problems if f"run {rid}: {member}: " in p and "MiB" in p and
            "not parsed" in p], report.problems
    assert "the runs could not be read" in report.not_checked[0]
    assert took < 5, took  # ~0.3 s here; parsing it took ~9 s
    home = tmp_path / "home"
    done = run_d500(home, "check", str(bomb), "--rules", str(rules_dir))
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert f"{bomb}: run {rid}: {member}: " in out, out
    done = run_d500(home, "ledger", "--ledger", str(home / "ledger.sqlite"), "import", str(bomb),
                    "--rules", str(rules_dir))
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out and member in out, out
    assert not (home / "runs").exists()


def test_an_mllog_of_more_lines_than_a_run_writes_is_refused(digits_package, rules_dir,
                                                             tmp_path):
    """Blank lines past MAX_LOG_LINES (the bytes well under the cap): refused by their count."""
    rid = _seed_run(digits_package)
    bad = repack(digits_package, tmp_path / "lines.tar.gz",
                 forge_log(rid, lambda text: text + "\n" * MAX_LOG_LINES))
    problems = check(Package.open(bad), rules_dir).problems
    assert [p for p in problems if f"run {rid}: " in p and "lines" in p and "not parsed" in p], \
        problems


def test_the_logs_of_a_package_together_are_bounded(digits_package, rules_dir, monkeypatch):
    """The honest package passes the per-log caps; its logs together past the package's cap
    (lowered here to below their real total) are refused, naming the run where it passed."""
    pkg = Package.open(digits_package)
    sizes = [len(pkg.member(r.mllog_member)) for r in pkg.runs() if r.mllog_member]
    assert max(sizes) < package_module.MAX_LOG_BYTES and len(sizes) >= 2
    monkeypatch.setattr(package_module, "MAX_LOGS_BYTES", sum(sizes) - 1)
    with pytest.raises(D500Error, match="MLLOGs hold more than"):
        Package.open(digits_package).runs()
