"""MLLogger.withhold: the lines of the keys named wait in memory, the others are written as
ever, and `release` (or `close`) puts each withheld line back where it was logged."""

from __future__ import annotations

from d500 import mllog


def test_withheld_lines_come_back_in_their_places(tmp_path):
    path = tmp_path / "mllog.txt"
    log = mllog.MLLogger(path)
    log.event("before", 1)
    log.withhold(mllog.EVAL_ACCURACY)
    for epoch in (1, 2):
        log.start(mllog.EVAL_START, metadata={"epoch_num": epoch})
        log.event(mllog.EVAL_ACCURACY, 0.5 + epoch / 10, metadata={"epoch_num": epoch})
        log.end(mllog.EVAL_STOP, metadata={"epoch_num": epoch})
    live = [r["key"] for r in mllog.parse_text(path.read_text())[0]]
    assert live == ["before", "eval_start", "eval_stop", "eval_start", "eval_stop"]
    log.release()
    log.event("after", 2)  # (appended after the rewrite, to the same file)
    log.close()
    records = mllog.parse_text(path.read_text())[0]
    assert [(r["key"], r["value"]) for r in records] == [
        ("before", 1), ("eval_start", None), ("eval_accuracy", 0.6), ("eval_stop", None),
        ("eval_start", None), ("eval_accuracy", 0.7), ("eval_stop", None), ("after", 2)]


def test_closing_releases_what_was_withheld(tmp_path):
    path = tmp_path / "mllog.txt"
    log = mllog.MLLogger(path)
    log.withhold(mllog.EVAL_ACCURACY)
    log.event(mllog.EVAL_ACCURACY, 0.9)
    assert path.read_text() == ""
    log.close()
    assert [r["value"] for r in mllog.parse_text(path.read_text())[0]] == [0.9]
