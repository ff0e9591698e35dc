"""The tuning budget is exact (issue 17): a study holds exactly the workload's trials, each the one
the Halton plan draws for its number from the workload's organiser seed. The attacks, with real
tuning runs of an entry with a search space (the fixture's rules: 2 studies of 2 trials):

- extra trials: `d500 tune --trials 3` on a workload of 2: check refuses every study (its budget
  and its trial 2), and only trials 0..1 ever score;
- renumbered trials: the same studies with trial 0 dropped, trials 1-2 renumbered 0-1 (seeds
  rewritten to their new numbers'), the budget rewritten to 2, everything re-sealed as d500 seals
  it: budget and numbering pass, the recomputed plan does not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d500.competition.check import check
from d500.competition.layout import MANIFEST, STUDIES, mllog_member, run_member
from d500.competition.package import Package
from d500.ledger import Ledger
from d500.training import score
from d500.training.tuning import seed_of

from .conftest import OPTIMIZER, SUBMISSION
from .packages import repack, reseal

NAME = "digits-tuner"
RESULT = "completeness: digits-mlp (level 2) / torch: "


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, rules_dir, run_d500) -> dict:
    """An entry with a search space tuned with `--trials 3` (2 studies) and packaged."""
    base = tmp_path_factory.mktemp("tuner")
    entry = base / "entry"
    entry.mkdir()
    text = SUBMISSION.replace("name: digits-packager", f"name: {NAME}")
    text = text[:text.index("feasible_points:")] + "search_space:\n  lr: {min: 0.02, max: 0.2, " \
                                                   "scale: log}\n"
    (entry / "submission.yaml").write_text(text)
    (entry / "guarded.py").write_text(OPTIMIZER)
    home, workload = base / "home", str(rules_dir / "2-training" / "digits-mlp.yaml")
    done = run_d500(home, "tune", workload, "--submission", str(entry), "--trials", "3")
    assert done.returncode in (0, 1), done.stderr
    out = base / f"{NAME}.tar.gz"
    packed = run_d500(home, "package", str(entry), "--out", str(out))
    assert packed.returncode == 0, packed.stderr
    return {"home": home, "package": out}


def test_extra_trials_are_refused_and_never_score(tuned, rules_dir):
    pkg = Package.open(tuned["package"])
    report = check(pkg, rules_dir)
    studies = sorted(s["id"] for s in pkg.studies())
    assert len(studies) == 2 and len(pkg.runs()) == 6
    for number in range(len(studies)):  # named by their number in the tuning, from 0
        assert (f"{RESULT}study {number} records a budget of 2 studies of 3 trials; the "
                f"workload's tuning is 2 studies of 2 trials (d500 tune without --studies/"
                f"--trials)" in report.problems)
        assert (f"{RESULT}study {number}: trial(s) 2 beyond the workload's 2 trials per study "
                f"(only trials 0..1 may run and score)" in report.problems)
    assert not [p for p in report.problems if "Halton plan" in p]  # trials 0-1 are the plan's
    with Ledger(tuned["home"] / "ledger.sqlite") as book:
        [entry] = score.entries(book.runs(level=2))
    assert sorted(r["trial"] for r in entry.trials) == [0, 0, 1, 1]  # trial 2 never scores


def test_renumbered_trials_do_not_hold_their_numbers_parameters(tuned, rules_dir, tmp_path):
    pkg = Package.open(tuned["package"])
    trials = {(r.trial[0], r.trial[1]): r for r in pkg.runs() if r.trial is not None}
    studies = sorted(s["id"] for s in pkg.studies())
    dropped = [trials[sid, 0].origin_id for sid in studies]

    def forge(found: dict[str, bytes]) -> None:
        for place, sid in enumerate(studies):
            for old, new in ((1, 0), (2, 1)):
                def renumber(rec: dict, new: int = new, place: int = place) -> None:
                    rec["trial"][1] = new
                    rec["row"]["seed"] = seed_of("trial", 0, place, new)
                reseal(trials[sid, old].origin_id, record=renumber)(found)
        for rid in dropped:  # its link stays in chain.json (re-made above), as a hash only
            del found[run_member(rid)]
            del found[mllog_member(rid)]
        manifest = json.loads(found[MANIFEST])
        manifest["runs"] = [r for r in manifest["runs"] if r not in dropped]
        found[MANIFEST] = json.dumps(manifest).encode()
        listed = json.loads(found[STUDIES])
        for study in listed:
            study["budget"] = {"studies": 2, "trials": 2}
            study["name"] = re.sub(r", 3 trials,", ", 2 trials,", study["name"])
        found[STUDIES] = json.dumps(listed).encode()

    forged = Package.open(repack(tuned["package"], tmp_path / "renumbered.tar.gz", forge))
    assert forged.member_problems() == [] and forged.chain_problems() == []  # re-sealed
    report = check(forged, rules_dir)
    completeness = [p for p in report.problems if p.startswith("completeness: ")]
    assert not [p for p in completeness if "budget" in p or "beyond" in p or "missing" in p]
    for place in range(len(studies)):
        assert (f"{RESULT}study {place}: trial(s) 0, 1 do not hold the parameters and seed that "
                f"study {place}'s Halton plan draws for their numbers (tuning seed 0): "
                f"trials renumbered, re-drawn or edited") in completeness, completeness


def test_the_plan_check_reads_no_entry_code(tuned, rules_dir, tmp_path):
    """The packaged optimizer file is never imported by check: one that raises on import
    changes nothing in the plan check."""
    def poison(found: dict[str, bytes]) -> None:
        found["d500-package/files/submission/guarded.py"] = b"raise SystemExit('imported')\n"
    report = check(Package.open(repack(tuned["package"], tmp_path / "p.tar.gz", poison)),
                   rules_dir)
    assert not [p for p in report.problems if "Halton plan" in p or "tuning plan" in p]
    assert Path(tuned["package"]).is_file()
