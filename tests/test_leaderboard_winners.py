"""Issue 22, the HTML board: who won is said first (a winners summary per level above every
table, in Markdown and HTML: the best entry per workload, its ranking figure, its margin over the
runner-up, and at the training levels whether that margin holds over the seeds); the performance
profile over fewer than two workloads is a table, not a plot; the tuning curves have a log time
axis, the legend outside the axes and each entry's median curve in front; the loaded-machine mark
shows only where it tells rows apart (else one note under the table). The page read in headless
Chromium at 1280 and 700 px: the winners above the first table, nothing wider than the window."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from d500 import leaderboard
from d500.leaderboard import summary
from d500.ledger import Ledger
from d500.training import score, views
from d500.training.seeds import required

# others above the whole machine (2 cores): loaded at any share, the suite's (tests/conftest.py) too
LOADED = {"load_average": {"loaded": True, "others": [2.53, 0.7], "usable_cores": 2}}
IDLE = {"load_average": {"loaded": False, "others": [0.1, 0.1], "usable_cores": 2}}
# level 2: digits (every seed of "fast" beats every seed of "slow") and overlap (they overlap)
SEED_TIMES = {("digits", "fast"): (3.0, 4.0, 5.0), ("digits", "slow"): (10.0, 11.0, 12.0),
              ("overlap", "fast"): (3.0, 6.0, 9.0), ("overlap", "slow"): (5.0, 7.0, 8.0)}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def level0(ledger: Ledger, tmp_path: Path, loaded: dict[str, dict]) -> None:
    """gemm: fast (1 ms), slow (3 ms) and slowest (4 ms), each run with `loaded[name]`."""
    gemm = tmp_path / "gemm.yaml"
    gemm.write_text("name: gemm\nlevel: 0\nmetrics: [latency, forward_error]\n"
                    "rank_by: latency\n")
    for sub, latency in (("fast", 1e-3), ("slow", 3e-3), ("slowest", 4e-3)):
        for _ in range(2):
            ledger.start_run(level=0, workload="gemm", submission=sub, backend="numpy",
                             workload_file=gemm).finish(
                "succeeded", figures={"latency": latency, "forward_error": 1e-7},
                details=loaded.get(sub, {}))


def level2(ledger: Ledger, tmp_path: Path, curves: bool = False) -> None:
    """Two level-2 workloads of two entries on torch, three of the rules' seeds each; with
    `curves`, each run's validation accuracy at a few wall times (one slow run out to 65 s)."""
    for workload in ("digits", "overlap"):
        wf = tmp_path / f"{workload}.yaml"
        wf.write_text(f"name: {workload}\nlevel: 2\nmetrics: [time_to_accuracy, test_accuracy, "
                      "val_accuracy]\nrank_by: time_to_accuracy\n")
        for sub in ("fast", "slow"):
            seeds = required(2, workload, sub, "torch", 3)
            for seed, tta in zip(seeds, SEED_TIMES[workload, sub], strict=True):
                run = ledger.start_run(level=2, workload=workload, submission=sub,
                                       backend="torch", seed=seed, workload_file=wf)
                if curves:
                    end = 65.0 if (sub, tta) == ("slow", 12.0) else tta
                    for t, acc in ((0.0, 0.1), (end / 4, 0.5), (end / 2, 0.8), (end, 0.97)):
                        run.evaluation(step=int(t * 10), metrics={"val_accuracy": acc},
                                       wall_time=t)
                run.finish("succeeded", figures={"time_to_accuracy": tta, "test_accuracy": 0.96,
                                                 "val_accuracy": 0.97})


def test_the_markdown_board_opens_with_the_winners_of_every_level(home, tmp_path):
    ledger = Ledger()
    level0(ledger, tmp_path, {})
    level2(ledger, tmp_path)
    copy = {"reproduction": {"package": "ab" * 32, "entry": "slow"}}  # fastest, never ranked
    ledger.start_run(level=0, workload="gemm", submission="slow", backend="numpy",
                     workload_file=tmp_path / "gemm.yaml").finish(
        "succeeded", figures={"latency": 5e-4, "forward_error": 1e-7}, details=copy)
    md = leaderboard.render(ledger, fmt="md")
    ledger.close()
    start = md.index("## Winners")
    assert start < md.index("| rank |") and start < md.index("## level 0")
    top = md[start:md.index("## level 0")]
    assert "**level 0: operators**" in top and "**level 2: training**" in top
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in top.splitlines()
        if line.startswith("| ") and not line.startswith("| workload"))}
    assert rows["gemm"] == ["fast / numpy", "latency 1 ms (median of 2 runs; lower is better)",
                            "3.00×: runner-up slow / numpy, 3 ms", "—"]
    assert "reproduction" not in top and "| 1 | fast |" in md  # beside its row, below
    assert rows["digits"][:3] == [
        "fast / torch", "time_to_accuracy 4 s (median of 3 seeds; lower is better)",
        "2.75×: runner-up slow / torch, 11 s"]
    assert rows["digits"][3] == ("significant: every seed of the winner beats every seed of the "
                                 "runner-up ([3 s – 5 s] against [10 s – 12 s], n=3 and 3)")
    assert rows["overlap"][:3] == ["fast / torch", "time_to_accuracy 6 s (median of 3 seeds; "
                                   "lower is better)", "1.17×: runner-up slow / torch, 7 s"]
    assert rows["overlap"][3].startswith("not significant: the seed ranges overlap ([3 s – "
                                         "9 s] against [5 s – 8 s]")


def test_the_terminal_board_opens_with_the_winners_too(home, tmp_path):
    ledger = Ledger()
    level0(ledger, tmp_path, {})
    level2(ledger, tmp_path)
    term = leaderboard.render(ledger, fmt="terminal")
    ledger.close()
    start = term.index("Winners")
    assert start < term.index("level 0 · gemm") and start < term.index("level 2 · digits")
    top = " ".join(term[start:term.index("level 0 · gemm")].split())
    assert "level 0: operators" in top and "level 2: training" in top
    assert "fast / numpy" in top and "3.00×: runner-up slow / numpy" in top
    assert "significant: every seed of the winner" in top  # the cell wraps over lines


def test_the_loaded_mark_shows_only_where_it_separates_rows(home, tmp_path):
    ledger = Ledger()  # every row loaded: no row marked, one note under the table
    level0(ledger, tmp_path, {"fast": LOADED, "slow": LOADED, "slowest": LOADED})
    md = leaderboard.render(ledger, fmt="md", level=0)
    board = md[md.index("### level 0 · gemm"):]
    assert "| E1 |" in board and "· ⚠" not in board
    note = ("⚠ loaded machine: all of this table's runs ran on a loaded machine (6 timed run(s), "
            "other processes' load up to 2.5 on 2 cores)")
    assert board.count(note) == 1 and board.index("| (3) | slowest") < board.index(note)
    term = leaderboard.render(ledger, fmt="terminal", level=0)
    assert "E1 ⚠" not in term and note in " ".join(term.split())
    html = leaderboard.render(ledger, fmt="html", level=0)
    assert "<p class='note loaded'>⚠ loaded machine: all" in html
    assert html.count("⚠") == 2  # and the winner's figure: every entry was timed under load
    assert "(median of 2 runs; lower is better) ⚠ every entry was timed on a loaded machine" in html
    ledger.close()

    home2 = tmp_path / "home2"  # one row idle: the mark tells the loaded rows apart
    ledger = Ledger(home2 / "ledger.sqlite")
    level0(ledger, tmp_path, {"fast": LOADED, "slow": IDLE, "slowest": LOADED})
    md = leaderboard.render(ledger, fmt="md", level=0)
    marked = [line.split("|")[2].strip() for line in md.splitlines()
              if "⚠ loaded machine: 2 of 2 timed run(s)" in line]
    assert marked == ["fast", "slowest"] and "all of this table's runs" not in md
    ledger.close()


def test_a_performance_profile_over_one_workload_is_a_table(home, tmp_path):
    ledger = Ledger()
    level0(ledger, tmp_path, {})
    level2(ledger, tmp_path)
    boards = leaderboard.build(ledger, level=0)
    [part] = leaderboard.parts(boards, ledger)
    [organiser] = part.views
    assert organiser.plots == [] and organiser.notes[0] == summary.ONE_WORKLOAD
    assert [row[:2] for row in organiser.rows] == [["fast", "numpy"], ["slow", "numpy"],
                                                   ["slowest", "numpy"]]
    runs = [r for r in ledger.runs(level=2) if r["workload"] == "digits"]
    one = views.profile_view(score.entries(runs))
    assert one.plots == [] and "one workload, so a table" in one.title
    assert one.headers == ["submission / backend", "digits: time to the target", "× best",
                           "profile score"]
    assert one.rows == [["fast / torch", "4 s", "1.00×", "1.000"],
                        ["slow / torch", "11 s", "2.75×", "0.417"]]
    two = views.profile_view(score.entries(ledger.runs(level=2)))  # two workloads: the plot
    assert len(two.plots) == 1 and two.headers[1] == "profile score"
    ledger.close()


def test_the_tuning_curves_have_a_log_time_axis_the_legend_outside_and_medians_in_front(
        home, tmp_path, monkeypatch):
    from d500.leaderboard import plots

    ledger = Ledger()
    level2(ledger, tmp_path, curves=True)
    drawn = []
    monkeypatch.setattr(plots, "png", lambda fig: drawn.append(fig) or b"")
    entries = [e for e in score.entries(ledger.runs(level=2)) if e.workload == "digits"]
    assert views._curves(entries, ledger) == b""
    ledger.close()
    [fig] = drawn
    [ax] = fig.axes
    assert ax.get_xscale() == "log"
    fig.canvas.draw()
    box, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
    assert legend.y1 <= box.y0 or legend.x0 >= box.x1  # outside the axes, not over the data
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["fast / torch: median of 3 runs", "slow / torch: median of 3 runs",
                      "target"] or labels[:2] == ["fast / torch: median of 3 runs",
                                                  "slow / torch: median of 3 runs"]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    runs = [ln for label, ln in lines.items() if label.startswith("_")]
    medians = [lines[label] for label in labels[:2]]
    assert len(runs) >= 6 and max(ln.get_zorder() for ln in runs) < min(
        m.get_zorder() for m in medians)
    assert max(ln.get_xdata().max() for ln in runs) == 65.0
    # the median of "slow": at 30 s its runs hold 0.97, 0.97 and (the 65-s run) 0.5
    xs, ys = views.median_curve([[(2.5, 0.5), (5.0, 0.8), (10.0, 0.97)],
                                 [(2.75, 0.5), (5.5, 0.8), (11.0, 0.97)],
                                 [(16.25, 0.5), (32.5, 0.8), (65.0, 0.97)]])
    assert dict(zip(xs, ys))[16.25] == 0.97 and dict(zip(xs, ys))[2.5] == 0.5
    assert dict(zip(xs, ys))[65.0] == 0.97


@pytest.mark.browser
def test_the_html_page_shows_the_winners_above_the_first_table(home, tmp_path):
    from browser import chromium, page_width_problems
    from PIL import Image
    from selenium.webdriver.common.by import By

    ledger = Ledger()
    level0(ledger, tmp_path, {"fast": LOADED, "slow": IDLE})
    level2(ledger, tmp_path, curves=True)
    page = leaderboard.write_html(tmp_path / "board.html", ledger)
    ledger.close()
    with chromium(tmp_path / "profile") as driver:
        for width in (1280, 700):
            driver.set_window_size(width, 900)
            driver.get(page.as_uri())
            assert page_width_problems(driver) == [], width
            winners = driver.find_element(By.ID, "winners")
            tables = driver.find_elements(By.CSS_SELECTOR, "table.board, section.level table")
            first = min(t.rect["y"] for t in tables)
            assert winners.rect["y"] + winners.rect["height"] <= first, width
            assert winners.rect["y"] < 900  # on the first screen, without scrolling
            heads = [h.text for h in winners.find_elements(By.TAG_NAME, "h3")]
            assert heads == ["level 0: operators", "level 2: training"]
            cells = [td.text for td in winners.find_elements(By.CSS_SELECTOR, "td.winner")]
            # the fastest gemm run was timed on a loaded machine: ranked apart, never the winner
            assert cells == ["slow / numpy", "fast / torch", "fast / torch"]
            link = winners.find_element(By.CSS_SELECTOR, "td a").get_attribute("hash")
            assert re.fullmatch(r"#w\d+", link)
            assert driver.find_element(By.CSS_SELECTOR, link).text.startswith("level 0 · gemm")
            shot = tmp_path / f"top-{width}.png"
            assert driver.get_screenshot_as_file(str(shot))
            with Image.open(shot) as img:  # the winners' box is painted on the first screen
                scale = img.size[0] / driver.execute_script("return window.innerWidth")
                y = int((winners.rect["y"] + 4) * scale)
                x = int((winners.rect["x"] + winners.rect["width"] / 2) * scale)
                assert img.convert("RGB").getpixel((x, y)) == (247, 250, 245), width
        marks = driver.find_elements(By.XPATH, "//td[contains(., '⚠ loaded machine')]")
        assert len(marks) == 1  # the loaded row of the three; the idle and unmeasured ones not


def test_a_workload_no_run_timed_says_so_in_the_winners(home, tmp_path):
    """`d500 op validate` records errors, no latency: its case's winner row said "no ranked
    entry (latency)", which left a user who had only validated guessing why."""
    conv = tmp_path / "conv.yaml"
    conv.write_text("name: conv\nlevel: 0\nmetrics: [latency, forward_error]\n"
                    "rank_by: latency\n")
    with Ledger() as ledger:
        ledger.start_run(level=0, workload="conv", submission="mine", backend="numpy",
                         workload_file=conv).finish("succeeded", figures={"forward_error": 1e-7})
        level0(ledger, tmp_path, {})  # gemm: timed, ranked
        md = leaderboard.render(ledger, fmt="md", level=0)
    winners = md.split("## level 0")[0]
    assert "| conv | — | no ranked entry (no run measured latency) | — | — |" in winners, winners
    assert "| gemm | fast / numpy | latency 1 ms (" in winners, winners
