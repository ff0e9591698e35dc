"""The organiser's seeds score (issue 17, seeds scouted by entry name): a result the organiser
re-ran at seeds it drew after the package was committed (`d500 reproduce --fresh-seeds N`, into its
own ledger) is ranked on those runs; the package's own row (its required seeds, which follow from
the name the sender picked) is listed beside it, unranked; every other row of the board scored on
seeds known before its runs is listed after, unranked. Real packages, real runs, real ledgers.

The attack (`-m slow`): a sender trains K names' required seeds in a throw-away home, submits the
fastest name, and the organiser scores the package at its drawn seeds, which no name moves: the
same runs trained under the slowest name score the same epochs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from d500.competition import reproduce_seeds
from d500.leaderboard import ranking
from d500.ledger import Ledger
from d500.training import score, seeds, views

from .conftest import OPTIMIZER
from .conftest import _rules as fixture_rules

DRAW = 11  # the organiser's draw seed (fixed, so that the test's runs are fixed)


def _organiser(home: Path, package: Path, rules: Path, run_d500, n: int = 2
               ) -> tuple[int, str]:
    imported = run_d500(home, "ledger", "import", str(package), "--rules", str(rules))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    done = run_d500(home, "reproduce", str(package), "--fresh-seeds", str(n), "--seed",
                    str(DRAW), "--rules", str(rules))
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


RULES = """\
name: w
level: 2
metrics: [time_to_accuracy, test_accuracy, epochs]
rank_by: time_to_accuracy
seeds: 2
"""


def _seed_run(book: Ledger, path: Path, sub: str, seed: int, tta: float, stamp=None) -> int:
    run = book.start_run(level=2, workload="w", submission=sub, backend="torch", seed=seed,
                         workload_file=path)
    details = {"target": 0.97, **({"reproduction": stamp} if stamp else {})}
    run.finish("succeeded", figures={"time_to_accuracy": tta, "test_accuracy": 0.97,
                                     "epochs": tta}, details=details)
    return run.id


def _drawn(book: Ledger, path: Path, sub: str, draw: int, times: list[float]) -> list[int]:
    """Runs as `d500 reproduce --fresh-seeds` records them: stamped with the package, the draw
    seed and the fresh seed (d500.competition.reproduce.fresh)."""
    out = []
    for i, (s, tta) in enumerate(zip(reproduce_seeds.draw(draw, "w", "torch", len(times)),
                                     times)):
        out.append(_seed_run(book, path, sub, s, tta, {
            "package": f"{sub:0<64}", "entry": sub, "origin_run": 1, "draw_seed": draw,
            "fresh_seed": s}))
    return out


def test_the_organisers_drawn_seeds_rank_and_seeds_known_before_do_not(tmp_path, monkeypatch):
    """On recorded ledger rows: the scouted entry (its required seeds at 1 s) is listed after,
    unranked; B at the organiser's two drawn seeds ranks, its own required seeds (1 s) beside it,
    unranked; C at one drawn seed of the two the workload scores is listed beside its own rows,
    which, scored on seeds known before, are listed after too."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    path = tmp_path / "w.yaml"
    path.write_text(RULES)
    book = Ledger(tmp_path / "home" / "ledger.sqlite")
    for sub in ("scouted", "B", "C"):
        for s in seeds.required(2, "w", sub, "torch", 2):
            _seed_run(book, path, sub, s, 1.0)
    b_drawn = _drawn(book, path, "B", 5, [4.0, 6.0])
    c_drawn = _drawn(book, path, "C", 5, [2.0])
    again = _drawn(book, path, "B", 5, [0.5])  # a drawn seed re-run: its first run counts
    [board] = ranking.build(book, level=2)
    rows = {(e.submission, ranking.drawn_entry(e)): e for e in board.entries}
    b = rows[("B", True)]
    assert b.rank == 1 and b.aggregate["time_to_accuracy"] == 5.0 and not b.seeds_note
    assert [r["id"] for r in ranking._scored(2, b.runs)] == b_drawn
    assert [e.rank for e in board.entries] == [1, None, None, None, None]
    assert board.entries[1] is rows[("B", False)]  # beside the row that scores it
    assert rows[("B", False)].seeds_note == "not scored: its own seeds; the organiser's score it"
    assert rows[("C", True)].seeds_note == "not scored: 1 of 2 drawn seeds"
    for sub in ("scouted", "C"):  # seeds the name picks: after, unranked, though fastest
        assert rows[(sub, False)].aggregate["time_to_accuracy"] == 1.0
        assert rows[(sub, False)].seeds_note == "unranked: its seeds were known before its runs"
    assert [r["id"] for r in book.runs() if seeds.drawn(r)] == b_drawn + c_drawn + again
    assert [r["id"] for r in seeds.sort_out(b.runs, own_draws=True).unscored] == again
    # a drawn stamp on a row imported from a package (its sender's word) never scores
    row = dict(book.get(b_drawn[0]), package={"sha256": "0" * 64})
    assert not seeds.drawn(row)
    assert seeds.sort_out([book.get(b_drawn[0])]).scored == []  # a package under check
    # the level's views say the same
    entries = score.entries(book.runs(level=2))
    by = {(e.name, e.drawn): e for e in entries}
    assert [r["id"] for r in by[("B", True)].seeds] == b_drawn
    assert by[("B", False)].seeds_note == "its own seeds; the organiser's score it"
    assert by[("scouted", False)].seeds_note.startswith("its seeds were known before its runs")
    notes = views.seeds_view(entries).notes
    assert any(n.startswith("scored: w / B · at the organiser's seeds") and "draw seed 5" in n
               for n in notes), notes
    profile = views.profile_view(entries)
    assert [row[0] for row in profile.rows] == ["B · at the organiser's seeds, package "
                                                f"{'B':0<8} / torch"]


def test_too_few_drawn_seeds_is_exit_2_before_anything_runs(digits_package, rules_dir,
                                                           run_d500, tmp_path):
    done = run_d500(tmp_path / "org", "reproduce", str(digits_package), "--fresh-seeds", "1",
                    "--rules", str(rules_dir))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert "--fresh-seeds 1: digits-mlp scores 2 seeds" in line and "draw at least 2" in line
    assert not (tmp_path / "org" / "ledger.sqlite").exists() or not Ledger(
        tmp_path / "org" / "ledger.sqlite").runs()


SCOUT = """\
name: {name}
level: 2
workloads: [digits-mlp]
optimizer: sgd.py:Sgd
batch_size: 32
hyperparameters: {{lr: 0.05, momentum: 0.9}}
schedule: {{name: cosine, warmup: 0.05}}
feasible_points:
  - {{fail_at: 1}}
"""


def _scout_rules(folder: Path) -> Path:
    """The competition fixture's digits-mlp with one seed and one tuning trial, so that a name
    costs one run."""
    fixture_rules(folder / "fixture")
    text = (folder / "fixture" / "2-training" / "digits-mlp.yaml").read_text()
    for field, line in (("seeds", "seeds: 1"),
                        ("tuning", "tuning: {studies: 1, trials: 1, seed: 0}")):
        text, n = re.subn(rf"(?m)^{field}:.*$", line, text)
        assert n == 1, field
    (folder / "2-training").mkdir(parents=True)
    (folder / "2-training" / "digits-mlp.yaml").write_text(text)
    return folder


@pytest.mark.slow
def test_scouting_names_and_submitting_the_fastest_gains_nothing(run_d500, tmp_path):
    """The attack: K names' required seeds trained in the sender's home, the fastest name tuned,
    packaged and sent. The organiser imports it and scores it at a seed it draws: the package's
    own (scouted) run is listed beside, unranked; the slowest name's recipe trained at the same
    drawn seed meets the target in the same epochs: the name moved nothing that scores. (116 s
    at load 13-15 on 2 cores; the same with two commands at a time.)"""
    rules = _scout_rules(tmp_path / "rules")
    workload = str(rules / "2-training" / "digits-mlp.yaml")
    home = tmp_path / "sender"
    epochs = {}
    for k in range(3):
        name = f"scout-{k}"
        folder = tmp_path / name
        folder.mkdir()
        (folder / "submission.yaml").write_text(SCOUT.format(name=name))
        (folder / "sgd.py").write_text(OPTIMIZER.replace("class Guarded", "class Sgd"))
        done = run_d500(home, "train", workload, "--submission", str(folder), "--threads", "1",
                        "--json")
        assert done.returncode == 0, done.stderr
        [run] = json.loads(done.stdout)
        epochs[name] = run["figures"].get("epochs", math.inf) \
            if run["status"] == "succeeded" else math.inf
    assert all(math.isfinite(v) for v in epochs.values()), epochs
    best, worst = min(epochs, key=epochs.get), max(epochs, key=epochs.get)
    tuned = run_d500(home, "tune", workload, "--submission", str(tmp_path / best), "--threads",
                     "1", "--json")
    assert tuned.returncode == 0, tuned.stderr
    package = tmp_path / f"{best}.tar.gz"
    packed = run_d500(home, "package", str(tmp_path / best), "--out", str(package))
    assert packed.returncode == 0, packed.stderr

    org = tmp_path / "org"
    _, said = _organiser(org, package, rules, run_d500, n=1)
    assert "scored: the boards of" in said and "rank each result re-run here" in said, said
    [drawn] = reproduce_seeds.draw(DRAW, "digits-mlp", "torch", 1)  # no name in it
    with Ledger(org / "ledger.sqlite") as book:
        [board] = ranking.build(book, level=2)
    [scored] = [e for e in board.entries if ranking.drawn_entry(e)]
    [own] = [e for e in board.entries if e.package and not ranking.drawn_entry(e)]
    assert scored.rank == 1 and own.rank is None and "not scored" in own.seeds_note
    [run] = ranking._scored(2, scored.runs)
    assert run["seed"] == drawn and run["submission"] == best and run["status"] == "succeeded"

    # the slowest name at the organiser's seed: the same epochs, so the best name gained nothing
    again = run_d500(home, "train", workload, "--submission", str(tmp_path / worst), "--seed",
                     str(drawn), "--threads", "1", "--json")
    assert again.returncode == 0, again.stderr
    [other] = json.loads(again.stdout)
    print(f"scouted epochs {epochs}; {best} sent; scored at drawn seed {drawn}: "
          f"{run['figures'].get('epochs')} epochs; {worst} there: {other['figures']}")
    assert (other["status"], other["figures"].get("epochs")) == (
        run["status"], run["figures"].get("epochs")), (epochs, other, run["figures"])
