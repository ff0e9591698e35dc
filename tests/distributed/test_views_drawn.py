"""Level 3's table and the organiser's seeds (issue 17): a row at seeds the organiser drew (`d500
reproduce --fresh-seeds`) comes first, the package's own row right after it, and a faster row
scored on seeds known before its runs (the entry's name picks them) after both."""

from __future__ import annotations

from types import SimpleNamespace

from d500.distributed import views
from d500.training.seeds import required

TEXT = "name: w\nlevel: 3\nseeds: 1\n"


def run(rid: int, submission: str, tta: float, seed: int, package: bool = True) -> dict:
    sha = f"{rid:064x}"
    source = {"id": rid, "entry": submission, "sha256": sha, "forced": False, "packages": 1}
    return {"id": rid, "workload": "w", "workload_sha256": "s", "study": None, "level": 3,
            "status": "succeeded", "world_size": 2, "submission": submission,
            "backend": "torch", "environment": None, "hyperparameters": {"scheme": "sync"},
            "details": {}, "figures": {"time_to_accuracy": tta}, "seed": seed,
            "workload_text": TEXT, "workload_file": "w.yaml",
            "package": source if package else None, "source": source if package else None}


def test_the_organisers_seeds_rank_first_and_seeds_known_before_come_after():
    mine = run(1, "mine", 1.0, required(3, "w", "mine", "torch", 1, 2)[0])
    other = run(2, "other", 0.5, required(3, "w", "other", "torch", 1, 2)[0])
    drawn = run(3, "mine", 3.0, 12345, package=False)
    drawn["details"] = {"reproduction": {"package": f"{1:064x}", "entry": "mine",
                                         "draw_seed": 7, "fresh_seed": 12345}}
    forged = run(4, "other", 0.1, 999)  # a drawn stamp in an imported row: its sender's word
    forged["details"] = {"reproduction": {"package": f"{2:064x}", "fresh_seed": 999}}
    ledger = SimpleNamespace(runs=lambda level: [mine, other, drawn, forged])
    boards = [SimpleNamespace(workload="w", workload_sha256="s")]
    found = views.rows(3, boards, ledger)
    assert [(r.submission, r.time, r.drawn, r.reproduction, r.known) for r in found] == [
        ("mine · at the organiser's seeds, package 00000000", 3.0, True, False, False),
        ("mine · package mine 00000000", 1.0, False, True, False),
        ("other · package other 00000000", 0.5, False, False, True)], found
    assert [r["id"] for r in found[2].runs] == [2]  # the forged row: an exploration
