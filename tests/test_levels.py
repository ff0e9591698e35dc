"""A level is a plug-in: a minimal example level (a package written by this test, not shipped)
joins the CLI, `d500 run` and the leaderboard through one registration line."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from d500 import cli, levels
from d500.ledger import Ledger

TOY_LEVEL = '''
"""Level 7, a toy: times a NumPy sort of the size each workload file names."""

from __future__ import annotations

import time
from pathlib import Path

from d500.levels import Command, Context, Item, Level, Outcome, RunOptions, View

RULEBOOK = Path(__file__).parent / "rules"


class SortLevel(Level):
    number, name, folder = 7, "sorting", "7-sorting"
    commands = {"sort": Command("toylevel.cli", "level 7: time a sort")}

    def rulebook(self) -> Path:
        return RULEBOOK

    def load(self, path):
        from d500.workload import COMMON, Field, check_metrics, load
        data = load(path, {**COMMON, "size": Field(int, required=True)})
        check_metrics(data, Path(path), ("latency",), self.number)
        return data

    def plan(self, options: RunOptions) -> list[Item]:
        items = []
        for path in self.workload_files():
            data = self.load(path)
            if options.workloads and data["name"] not in options.workloads:
                continue
            items.append(Item(f"sort {data['name']}", [data["name"]], payload=path,
                              requested=[data["name"]]))
        return items

    def execute(self, item: Item, context: Context) -> Outcome:
        import numpy as np
        data = self.load(item.payload)
        values = np.random.default_rng(0).random(data["size"])
        with context.ledger.start_run(level=7, workload=data["name"], submission="numpy-sort",
                                      backend="numpy", workload_file=item.payload) as run:
            t0 = time.perf_counter()
            np.sort(values)
            run.record(figures={"latency": time.perf_counter() - t0})
        return Outcome(summary=f"sorted {data['size']} numbers")

    def views(self, boards, ledger) -> list[View]:
        return [View("sorting summary", ["workloads"], [[str(len(boards))]])]


LEVEL = SortLevel()
'''

TOY_CLI = '''
"""`d500 sort N`: prints the sorted numbers' first element."""
def main(argv, prog):
    print(f"{prog}: sorted {int(argv[0])} numbers")
    return 0
'''


@pytest.fixture
def toy(tmp_path, monkeypatch) -> Path:
    package = tmp_path / "toylevel"
    (package / "rules").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A toy level for the plug-in test."""\n')
    (package / "level.py").write_text(textwrap.dedent(TOY_LEVEL))
    (package / "cli.py").write_text(textwrap.dedent(TOY_CLI))
    (package / "rules" / "sort-1k.yaml").write_text(
        "name: sort-1k\nlevel: 7\nsize: 1000\nmetrics: [latency]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(levels, "REGISTERED", [*levels.REGISTERED, "toylevel.level"])  # the line
    yield package
    for name in [m for m in sys.modules if m.startswith("toylevel")]:
        del sys.modules[name]


def test_a_registered_level_joins_the_cli_the_runner_and_the_leaderboard(toy, tmp_path, capsys):
    assert [lv.number for lv in levels.all_levels()][-1] == 7
    assert cli.main(["--help"]) == 0
    assert "level 7: time a sort" in capsys.readouterr().out
    assert cli.main(["sort", "12"]) == 0
    assert "d500 sort: sorted 12 numbers" in capsys.readouterr().out

    # --backends: the frameworks this process gives threads to (JAX may already run in this
    # test process with another count, which it cannot change: a real `d500 run` is a new one)
    assert cli.main(["run", "--level", "7", "--no-html", "--backends", "reference",
                     "--quiet-wait", "0"]) == 0  # the wait: tests/test_provenance.py
    out = capsys.readouterr().out
    runs = Ledger(tmp_path / "home" / "ledger.sqlite").runs()
    assert [(r["level"], r["workload"], r["status"]) for r in runs] == [(7, "sort-1k", "succeeded")]
    assert runs[0]["figures"]["latency"] > 0
    assert "sort-1k" in out  # the board of what ran

    from d500 import leaderboard
    text = leaderboard.render(Ledger(tmp_path / "home" / "ledger.sqlite"), fmt="md")
    assert "sorting summary" in text and "numpy-sort" in text


def test_run_refuses_a_level_nobody_registered(toy, capsys):
    assert cli.main(["run", "--level", "8"]) == 2
    assert "--level '8': expected one of 0, 1" in capsys.readouterr().err
