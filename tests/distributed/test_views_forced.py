"""Level 3's table never lists an entry forced in past `d500 check` before a complete one, however
fast its recorded time."""

from __future__ import annotations

from types import SimpleNamespace

from d500.distributed import views


def run(rid: int, submission: str, tta: float, forced: bool) -> dict:
    return {"id": rid, "workload": "w", "workload_sha256": "s", "study": None,
            "status": "succeeded", "world_size": 2, "submission": submission,
            "backend": "torch", "environment": None, "hyperparameters": {"scheme": "sync"},
            "details": {}, "figures": {"time_to_accuracy": tta}, "seed": 0,
            "package": {"id": rid, "entry": submission, "sha256": f"{rid:064x}",
                        "forced": forced},
            "source": {"id": rid, "entry": submission, "sha256": f"{rid:064x}",
                       "forced": forced, "packages": 1}}


def test_a_forced_row_comes_after_a_complete_one(monkeypatch):
    monkeypatch.setattr(views.seeds, "split", lambda runs, **_: (list(runs), []))
    ledger = SimpleNamespace(runs=lambda level: [run(1, "honest", 10.0, False),
                                                 run(2, "forged", 0.1, True)])
    boards = [SimpleNamespace(workload="w", workload_sha256="s")]
    found = views.rows(3, boards, ledger)
    assert [(r.forced, r.time) for r in found] == [(False, 10.0), (True, 0.1)]
    assert "forced" in found[1].submission and "forced" not in found[0].submission


def test_a_row_timed_while_others_took_the_machine_is_marked_by_what_the_run_recorded(
        monkeypatch):
    """The mark follows the CPU other processes took during the run (its LoadWatch record's
    `during`) under the board's own share, not a flag the sender wrote."""
    monkeypatch.setattr(views.seeds, "split", lambda runs, **_: (list(runs), []))
    monkeypatch.setenv("D500_LOADED_SHARE", "0.25")
    busy, quiet = run(1, "busy", 1.0, False), run(2, "quiet", 2.0, False)
    busy["details"] = {"load_average": {"during": 1.2, "usable_cores": 2, "loaded": False}}
    quiet["details"] = {"load_average": {"during": 0.1, "usable_cores": 2, "loaded": True}}
    ledger = SimpleNamespace(runs=lambda level: [busy, quiet])
    boards = [SimpleNamespace(workload="w", workload_sha256="s")]
    found = {r.submission.split(" ")[0]: r for r in views.rows(3, boards, ledger)}
    assert found["busy"].contended and not found["quiet"].contended


def test_a_reproduction_row_comes_right_after_the_row_it_reproduces(monkeypatch):
    """As on the workload's board: a faster reproduction was listed before the package it
    re-ran, by its time, among the other entries."""
    monkeypatch.setattr(views.seeds, "split", lambda runs, **_: (list(runs), []))
    package, other = run(1, "mine", 10.0, False), run(2, "other", 5.0, False)
    copy = run(3, "mine", 1.0, False)
    del copy["package"], copy["source"]
    copy["details"] = {"reproduction": {"package": f"{1:064x}", "entry": "mine"}}
    ledger = SimpleNamespace(runs=lambda level: [package, other, copy])
    boards = [SimpleNamespace(workload="w", workload_sha256="s")]
    found = [r.submission for r in views.rows(3, boards, ledger)]
    assert found == ["other · package other 00000000", "mine · package mine 00000000",
                     "mine · reproduction of package 00000000"], found
