"""MLPerf's 2026 scoring with real runs (issue 19, item 6): a digits-mlp workload that allows
M = 3 seed runs of which N = 2 score. `d500 train` runs the 3 seeds the rules derive; the board
and `d500 check` (text and --json) name the 2 consecutive runs closest to the median and the RCP
scale, each with its reason. The attacks: the runs re-dated (MLLOGs too) into an order whose
window would score other runs, which moves nothing (the window's order is the rules' seeds');
one of the M deleted and the chain re-linked, and two runs' start times swapped and re-sealed,
in one package: both caught by check."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from d500 import mllog
from d500.competition.check import check
from d500.competition.check_cli import as_json, summary
from d500.competition.export import build
from d500.competition.package import Package
from d500.competition.scoring import CLOCK_SLACK_S
from d500.ledger import Ledger, integrity
from d500.paths import rulebook
from d500.training import score, seeds, views
from d500.training.seeds import required
from d500.training.window import choose

from .conftest import ENTRY
from .seed_attacks import delete_and_relink
from .test_consistency import forge

NAME = "digits-mlp (level 2) / torch"


def rules(folder: Path) -> Path:
    """The rulebook's digits-mlp (its reference convergence kept) with 3 seed runs, 2 scored."""
    text = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    for field, line in {"seeds": "seeds: 2\nseed_runs: 3",
                        "tuning": "tuning: {studies: 1, trials: 1, seed: 0}",
                        "budget": "budget: {max_epochs: 8, max_seconds: 120}"}.items():
        text, n = re.subn(rf"(?m)^{field}:.*$", line, text)
        assert n == 1, field
    (folder / "2-training").mkdir(parents=True)
    (folder / "2-training" / "digits-mlp.yaml").write_text(text)
    return folder


def packed(home: Path, entry: Path, out: Path) -> Package:
    """`d500 package`'s own function, in this process (a CLI start-up costs seconds here)."""
    return Package.open(build(entry, out, home / "ledger.sqlite"))


def redate(home: Path, out: Path, runs: list[dict]) -> Path:
    """A copy of `home` whose runs are re-dated into the order of their start times that makes
    a launch-time window score other runs than the seed order's; the copy's home."""
    ordered = sorted(runs, key=seeds.position)
    values = [score.time_to_target(r) for r in ordered]
    honest = choose(values, 2, 3)
    for perm in itertools.permutations(range(3)):  # (of distinct values, some order always
        other = choose([values[i] for i in perm], 2, 3)  # scores another pair)
        if {perm[j] for j in range(3) if other.picks(j)} != \
                {i for i in range(3) if honest.picks(i)}:
            break
    else:
        raise AssertionError(f"no order of {values} moves the window")
    slots = sorted(r["started_unix"] for r in runs)
    shift = {ordered[i]["id"]: slots[k] - ordered[i]["started_unix"] for k, i in enumerate(perm)}
    shutil.copytree(home, out, ignore=shutil.ignore_patterns("cache"))
    ledger = out / "ledger.sqlite"

    def edit(db: sqlite3.Connection) -> int:
        for rid, dt in shift.items():
            db.execute("UPDATE runs SET started = started + ?, stopped = stopped + ? "
                       "WHERE id = ?", (dt, dt, rid))
            db.execute("UPDATE evaluations SET recorded = recorded + ? WHERE run_id = ?",
                       (dt, rid))
            stored = db.execute("SELECT mllog FROM runs WHERE id = ?", (rid,)).fetchone()[0]
            log = out / "runs" / str(rid) / "mllog.txt"
            lines = []
            for line in log.read_text().splitlines(keepends=True):
                if line.startswith(mllog.TOKEN):
                    record = json.loads(line[len(mllog.TOKEN):])
                    record["time_ms"] += round(dt * 1e3)
                    line = mllog.TOKEN + json.dumps(record) + "\n"
                lines.append(line)
            log.write_text("".join(lines))
            db.execute("UPDATE artifacts SET sha256 = ?, bytes = ? WHERE run_id = ? AND "
                       "path = ?", (integrity.sha256_file(log), log.stat().st_size, rid, stored))
        return min(shift, key=lambda rid: db.execute(  # re-sealed from the first in the chain
            "SELECT chain_seq FROM runs WHERE id = ?", (rid,)).fetchone()[0])

    forge(ledger, edit)
    by_time = sorted(runs, key=lambda r: r["started_unix"] + shift[r["id"]])
    moved = choose([score.time_to_target(r) for r in by_time], 2, 3)
    assert {by_time[i]["id"] for i in range(3) if moved.picks(i)} != \
        {ordered[i]["id"] for i in range(3) if honest.picks(i)}  # a launch-time rule would move
    return out


@pytest.mark.slow
def test_m_seed_runs_the_window_that_scores_and_the_rcp_scale(entry_dir, run_d500, tmp_path):
    folder = rules(tmp_path / "rules")
    home, workload = tmp_path / "home", str(folder / "2-training" / "digits-mlp.yaml")
    done = run_d500(home, "train", workload, "--submission", str(entry_dir), "--json")
    assert done.returncode in (0, 1), done.stderr
    ran = json.loads(done.stdout)
    assert sorted(r["seed"] for r in ran) == sorted(required(2, "digits-mlp", ENTRY, "torch", 3))
    ledger = home / "ledger.sqlite"
    with Ledger(ledger) as book:
        [entry] = score.entries(book.runs(level=2))
    assert len(entry.seeds) == 2 and len(entry.unscored) == 1 and entry.choice is not None
    ordered = sorted(entry.seeds + entry.unscored, key=seeds.position)
    assert [r["id"] for r in ordered][entry.choice.start:entry.choice.start + 2] == \
        [r["id"] for r in entry.seeds]  # consecutive in the rules' seed order
    scale = entry.rcp()
    epochs = sorted(r["figures"].get("epochs", float("inf")) for r in entry.seeds)
    assert scale.result_mean == sum(epochs) / 2 or scale.result_mean is None or \
        scale.result_mean == float("inf")
    assert scale.factor == max(1.0, scale.reference_mean / scale.result_mean) \
        if scale.result_mean not in (None, float("inf")) else scale.factor == 1.0
    view = views.seeds_view([entry])
    [row] = view.rows
    assert row[3] == "2 of 3" and row[7] == f"{scale.factor:.3g}"
    assert any(n.startswith(f"scored: digits-mlp / {ENTRY} / torch: run(s) ") and "closest"
               in n for n in view.notes)
    assert f"RCP scale: digits-mlp / {ENTRY} / torch: {scale.reason}" in view.notes
    # check: the same runs and factor, in text and --json
    pkg = packed(home, entry_dir, tmp_path / "m.tar.gz")
    report = check(pkg, folder)
    assert not [p for p in report.problems if p.startswith("scoring")]
    # (this entry converges in about 5 epochs where the reference's olympic mean is 7.2: the
    # convergence check may flag it; the scale applies either way, and says which)
    [found] = report.scoring
    assert found["scored_runs"] == [r["id"] for r in entry.seeds]
    assert found["unscored_runs"] == sorted(r["id"] for r in entry.unscored)
    assert found["rcp_scale"] == scale.factor and found["why"] == entry.choice.reason
    assert json.loads(json.dumps(as_json(pkg, report)))["scoring"] == report.scoring
    lines = summary(pkg, report).splitlines()
    assert f"  checked  scoring: {NAME}: RCP scale {scale.factor:.4g}: {scale.reason}" in lines
    assert any(line.startswith(f"  checked  scoring: {NAME}: run(s) ") for line in lines)

    # attack 0: the runs re-dated into another order (start, stop, evaluations and every MLLOG
    # line moved alike, each log's digest in the seal updated, every seal re-made) whose window
    # would score other runs if the order were the start times': the order is the rules' seed
    # order, so the same runs score (a re-date within CLOCK_SLACK_S is named by nothing else)
    redated = redate(home, tmp_path / "redated", entry.seeds + entry.unscored)
    report = check(packed(redated, entry_dir, tmp_path / "redated.tar.gz"), folder)
    [found] = report.scoring
    assert found["scored_runs"] == [r["id"] for r in entry.seeds], report.problems

    # attack 1: the slowest of the M deleted, the chain re-linked: a missing seed and a gap
    slow = max(entry.seeds + entry.unscored, key=score.time_to_target)
    with Ledger(ledger) as book:
        newest = max(r["id"] for r in book.runs())
    delete_and_relink(ledger, [slow["id"]])
    # attack 2: the other two runs' start times swapped and every seal re-made: a new order
    first, last = sorted(r["id"] for r in entry.seeds + entry.unscored if r["id"] != slow["id"])

    def swap(db: sqlite3.Connection) -> int:
        a, b = (db.execute("SELECT started FROM runs WHERE id = ?", (i,)).fetchone()[0]
                for i in (first, last))
        db.execute("UPDATE runs SET started = ? WHERE id = ?", (b, first))
        db.execute("UPDATE runs SET started = ? WHERE id = ?", (a, last))
        return first

    forge(ledger, swap)
    report = check(packed(home, entry_dir, tmp_path / "forged.tar.gz"), folder)
    assert (f"completeness: {NAME}: required seed(s) {slow['seed']} (of the workload's 3) have "
            f"no run: the rules choose the seeds (`d500 train` without --seed runs them)"
            ) in report.problems
    # a gap shows where a later run was sealed after it; a deleted last run leaves none (the
    # missing seed above is what catches that)
    gap = any(p.startswith(f"completeness: the chain skips run id(s) {slow['id']}")
              for p in report.problems)
    assert gap == (slow["id"] < newest), report.problems
    # the new order: the scoring check names it where the runs started over CLOCK_SLACK_S
    # apart (a clock stepped back by less is let be); runs as short as these may start closer
    # (forked workers start in under a second), and then each moved start disagrees with the
    # MLLOG that opened its run, which the consistency check names
    started = {r["id"]: r["started_unix"] for r in entry.seeds + entry.unscored}
    reordered = any(p.startswith(f"scoring: {NAME}: run {last} started at ") and
                    f"before run {first}" in p for p in report.problems)
    redated = any(re.search(rf"run ({first}|{last}): started at .*but its MLLOG opened it", p)
                  for p in report.problems)
    assert reordered or redated, report.problems
    if abs(started[last] - started[first]) > CLOCK_SLACK_S:
        assert reordered, report.problems
