"""`d500 reproduce`'s report in a pipe (`| cat`, `| tee`) and in a narrow terminal: its table
is printed whole in a pipe, and no line (the verdict's least) is folded by rich's console width
(a verdict column cut mid-word, DISAGRE|ES, in a pipe); a terminal too narrow for the table
shows each run as a block of lines."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from d500.competition.reproduce import Reproduction, RunReport
from d500.competition.reproduce_cli import render
from d500.competition.reproduce_compare import Check

LONG = "a-very-long-workload-name-" * 4


def _result() -> Reproduction:
    """One disagreeing level-2 run with a wide row (a long workload name and evaluations
    note), and one agreeing run."""
    bad = RunReport(7, 2, LONG, "torch:compiled", 0, run_id=3)
    bad.checks = [Check("status", "succeeded", "succeeded", "equal", True),
                  Check("evaluations", 12, 12, "the same", True,
                        "12 evaluations, every one within 0.001 of its recorded accuracy " * 2),
                  Check("test_accuracy", 0.9, 0.5, "within 0.01", False, "a changed model")]
    good = RunReport(8, 2, "digits-mlp", "torch", 1, run_id=4)
    good.checks = [Check("status", "succeeded", "succeeded", "equal", True)]
    return Reproduction(Path("entry.tar.gz"), "0" * 64, "entry", 2, True, Path("l.sqlite"),
                        drawn_from=[7, 8], runs=[bad, good])


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_in_a_pipe_the_table_and_every_line_are_whole(capsys):
    render(_result())
    out = capsys.readouterr().out
    rows = _lines(out)
    assert len(rows) == 2, out  # one line a run: no cell folded at the console's 160 columns
    assert rows[0].rstrip().endswith("│ DISAGREES │") and LONG in rows[0], rows[0]
    assert max(len(line) for line in out.splitlines()) > 160
    [verdict] = [line for line in out.splitlines() if line.startswith("disagrees: ")]
    assert verdict.startswith("disagrees: run 7: test_accuracy: recorded 0.9")
    assert "1 of 2 run(s) agree with the package" in out.splitlines()[-1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_narrow_terminal_each_run_is_a_block_of_whole_lines(monkeypatch):
    """14 columns squeezed into 80 were ~2 characters each: where the table does not fit, each
    run is a block, its verdict first, one field a line; a wide terminal keeps the table."""
    monkeypatch.setenv("COLUMNS", "80")
    screen = _Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    render(_result())
    text = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue())  # the terminal's bold headers
    lines = text.splitlines()
    assert not [line for line in lines if line[:1] in "┏┃┡│└"], text  # no table
    assert "run 7: DISAGREES" in lines and "run 8: agrees" in lines, text
    assert f"  workload: {LONG}" in lines and "  backend: torch:compiled" in lines, text
    assert "  workload: digits-mlp" in lines, text
    monkeypatch.setenv("COLUMNS", "400")
    wide = _Terminal()
    monkeypatch.setattr(sys, "stdout", wide)
    render(_result())
    assert len(_lines(re.sub(r"\x1b\[[0-9;]*m", "", wide.getvalue()))) == 2  # the table
