"""Level 3's table of every entry shows the time to accuracy its workload's board ranks by: both
RCP-scaled (MLPerf's normalization) when the runs' epochs to target average below the reference
convergence, so one figure never reads two values on one page."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

from d500.distributed import views
from d500.leaderboard import ranking
from d500.paths import rulebook


def run(rid: int, tta: float, epochs: int) -> dict:
    text = (rulebook() / "3-distributed" / "digits-mlp.yaml").read_text()
    return {"id": rid, "workload": "digits-mlp", "workload_sha256": "s", "study": None,
            "status": "succeeded", "world_size": 2, "submission": "fast", "backend": "torch",
            "environment": None, "hyperparameters": {"scheme": "sync"}, "details": {},
            "figures": {"time_to_accuracy": tta, "epochs": epochs}, "seed": rid,
            "workload_text": text, "workload_file": "digits-mlp.yaml"}


def test_the_table_scales_time_to_accuracy_as_the_board_does(monkeypatch):
    monkeypatch.setattr(views.seeds, "split", lambda runs, **_: (list(runs), []))  # all 3 score
    runs = [run(1, 1.0, 4), run(2, 2.0, 4), run(3, 3.0, 4)]  # reference: 4-10 epochs, mean ~7
    ledger = SimpleNamespace(runs=lambda level: runs)
    boards = [SimpleNamespace(workload="digits-mlp", workload_sha256="s")]
    [row] = views.rows(3, boards, ledger)
    board = statistics.median(r["figures"]["time_to_accuracy"]
                              for r in ranking._scored(3, runs))
    assert board > 2.0 * 1.5  # scaled: the reference's olympic mean over 4 epochs
    assert row.time == board
    table = views.table_view([row], {"digits-mlp": 1})
    assert "RCP scale" in " ".join(table.notes)
    assert runs[1]["figures"]["time_to_accuracy"] == 2.0  # the ledger's rows untouched
