"""Reproductions on the level-2 board (issue 22, item 6): a `d500 reproduce` run is a re-check of a
package's result, not an entry. On a real ledger holding an entry's own runs and a reproduction of
its package, the reproduction's row is unranked, right after the row it reproduces, labelled as a
reproduction (also in the plots), and absent from the performance profiles."""

from __future__ import annotations

import shutil

import pytest

from d500.competition.package import Package
from d500.leaderboard import ranking
from d500.leaderboard.plots import entry_name
from d500.leaderboard.summary import summarise
from d500.ledger import Ledger
from d500.training import score, views

from .packages import draw_seed


@pytest.mark.slow  # a reproduction: 13 s at load 13
def test_a_reproduction_sits_beside_its_run_unranked_and_outside_the_profile(
        digits_home, digits_package, rules_dir, run_d500, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    pkg = Package.open(digits_package)
    first = min(r.origin_id for r in pkg.runs() if r.trial is None)  # a seed run, succeeded
    done = run_d500(home, "reproduce", str(digits_package), "--runs", "1", "--seed",
                    str(draw_seed(digits_package, 1, {first})), "--rules", str(rules_dir))
    # whether it agrees is test_reproduce's subject (a loaded machine can make its time
    # disagree); here only that it was recorded as a reproduction
    assert done.returncode in (0, 1) and "reproduced as run" in done.stderr + done.stdout, \
        done.stdout + done.stderr
    with Ledger(home / "ledger.sqlite") as book:
        [board] = ranking.build(book, level=2)
        runs = book.runs(level=2)
    [own, copy] = board.entries
    assert ranking.reproduction(copy) and not ranking.reproduction(own)
    assert own.package is None and own.rank == 1
    assert copy.rank is None and copy.ratio is None  # never in the ranking
    assert len(copy.runs) == 1 and copy.package["sha256"] == pkg.sha256
    names = [entry_name(board, e) for e in board.entries]
    assert names == ["digits-packager / torch",
                     f"digits-packager / torch (reproduction of {pkg.sha256[:8]})"]

    entries = score.entries(runs)
    assert [(e.submission, e.reproduction) for e in entries] == [
        ("digits-packager", False),
        (f"digits-packager · reproduction of package {pkg.sha256[:8]}", True)]
    profile = views.profile_view(entries)
    assert [row[0] for row in profile.rows] == ["digits-packager / torch"]
    # the organiser's summary (levels 0 and 1: the same boards) leaves it out as well
    summary = summarise([board], by_submission=True)
    assert [row.key for row in summary.rows] == ["digits-packager / torch"]
