"""The leaderboard's layout as a reader meets it (issue 22 item 11): the terminal board's env
column stays one line a row at 100 columns, its loaded-machine mark explained once under the
table; the Markdown board links its plots as PNG files beside the .md file instead of inlining
them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from d500 import cli, leaderboard
from d500.ledger import Ledger
from d500.training.seeds import required
from tests.test_leaderboard import register_level

# A level of our own whose view has a plot (as tests/test_leaderboard.py's level 7 does).
PLOTTING_LEVEL = """
from d500.levels import Level, View


class PlottingLevel(Level):
    number, name, folder = 7, "plotting", "7-plotting"

    def views(self, boards, ledger):
        from d500.leaderboard import plots
        fig = plots.figure(3, 2)
        fig.add_subplot().bar(range(len(boards)), [len(b.entries) for b in boards])
        return [View("entries per workload", ["workload"], [[b.workload] for b in boards],
                     [("entries per workload, as bars", plots.png(fig))], [])]


LEVEL = PlottingLevel()
"""

# others above the whole machine (2 cores): loaded at any share, the suite's (tests/conftest.py) too
LOADED = {"load_average": {"loaded": True, "others": [2.53, 0.7], "usable_cores": 2}}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def plotting_level(tmp_path, monkeypatch) -> None:
    register_level(tmp_path / "plotting-level", monkeypatch, "d500_plotting_level",
                   PLOTTING_LEVEL)


def test_the_terminal_level2_board_keeps_env_to_one_line_a_row_at_100_columns(home, tmp_path):
    """Three level-2 entries whose runs were all timed on a loaded machine: at 100 columns each
    row's env cell is "E1" on one line (it wrapped to 10): a mark on every row tells no row apart,
    so it is said once, under the table, for all its runs (in Markdown as well)."""
    wf = tmp_path / "digits.yaml"
    wf.write_text("name: digits\nlevel: 2\nmetrics: [time_to_accuracy, test_accuracy, "
                  "val_accuracy, epochs, samples_per_second]\nrank_by: time_to_accuracy\n")
    ledger = Ledger()
    entries = (("my-lion", "torch"), ("my-lion", "tensorflow"), ("sgd-momentum", "torch"))
    for sub, backend in entries:
        for i, seed in enumerate(required(2, "digits", sub, backend, 3)):
            run = ledger.start_run(level=2, workload="digits", submission=sub, backend=backend,
                                   seed=seed, workload_file=wf)
            run.finish("succeeded", figures={"time_to_accuracy": 3.0 + i, "test_accuracy": 0.95,
                                             "val_accuracy": 0.96, "epochs": 4.0,
                                             "samples_per_second": 1234.5}, details=LOADED)
    board = leaderboard.plain(leaderboard.build(ledger, level=2), ledger, width=100)
    table = board[board.index("level 2 · digits"):board.index("─ Environments ─")]
    body = [line for line in table.splitlines() if line.startswith("│")]
    env_cells = [line.rstrip().rstrip("│").rsplit("│", 1)[1].strip() for line in body]
    assert [c for c in env_cells if c] == ["E1"] * len(entries), table
    assert table.count("loaded machine") == 2  # "⚠ loaded machine: all ... on a loaded machine"
    note = ("⚠ loaded machine: all of this table's runs ran on a loaded machine (9 timed run(s), "
            "other processes' load up to 2.5 on 2 cores)")
    assert note in " ".join(table.split())
    md = leaderboard.render(ledger, level=2, fmt="md")
    assert "E1 · ⚠" not in md and md.count(f"_{note}_") == 1


def test_markdown_out_writes_its_plots_beside_the_file_and_links_them(
        home, tmp_path, plotting_level, capsys):
    from PIL import Image

    wf = tmp_path / "seven.yaml"
    wf.write_text("name: seven\nlevel: 7\nmetrics: [latency]\n")
    ledger = Ledger()
    for backend in ("torch", "tensorflow"):
        run = ledger.start_run(level=7, workload="seven", submission="mine", backend=backend,
                               seed=0, workload_file=wf)
        run.finish("succeeded", figures={"latency": 1e-3})
    out = tmp_path / "boards" / "X.md"
    out.parent.mkdir()
    stale = out.parent / "X-plots"
    stale.mkdir()
    (stale / "99-an-old-plot.png").write_bytes(b"old")
    assert cli.main(["leaderboard", "--format", "md", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out} and 1 plot(s) in {stale}" in said
    md = out.read_text()
    assert "data:image" not in md and len(md) < 10_000
    [link] = re.findall(r"!\[entries per workload, as bars\]\(([^)]+)\)", md)
    assert link == "X-plots/01-entries-per-workload-as-bars.png"  # relative to X.md
    with Image.open(out.parent / link) as img:
        assert img.format == "PNG" and img.size == (300, 200)
    assert sorted(p.name for p in stale.iterdir()) == ["01-entries-per-workload-as-bars.png"]
    # printed rather than written, the Markdown names the plot instead of inlining it
    printed = leaderboard.render(ledger, fmt="md")
    assert "data:image" not in printed
    assert ("_plot: entries per workload, as bars (PNG 300×200 px; written beside the file with "
            "`--out FILE.md`, or see `--format html`)_") in printed
