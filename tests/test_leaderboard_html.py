"""The HTML leaderboard of real runs at every level read in headless Chromium at 1280 px (no
horizontal scrolling, every plot decoded, the environments' legend and the rows' references to it,
the organiser's summaries, the winners above every table), and rows from two machines: times
ranked per machine unless the organiser passes --across-machines, accuracies ranked across
machines, imported packages marked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from d500 import leaderboard, metrics, provenance
from d500.ledger import Ledger
from d500.ledger.relay import Relay
from d500.training.seeds import required
from tests.distributed import level3_jobs as jobs
from tests.helpers import BENCH_METRICS, tiny_mlp

ROOT = Path(__file__).resolve().parent.parent
OTHER_CPU = "AMD EPYC 9654 96-Core Processor"


def d500(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def every_level(tmp_path_factory) -> Path:
    """A D500_HOME whose ledger holds real runs of every level: `d500 op bench` of the im2col
    Conv beside the reference, `net bench` of a tiny MLP on the reference and onnxruntime, one
    digits-mlp training run on torch, and one `mpiexec -n 1 d500 train` of the sync entry."""
    from d500.networks import workloads as net_workloads
    from d500.networks.bench import bench
    from d500.training import submission, workloads
    from d500.training.trainer import train

    assert jobs.MPIEXEC is not None, "no mpiexec beside Python: the venv's MPICH is missing"
    tmp = tmp_path_factory.mktemp("every-level")
    home = tmp / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("D500_HOME", str(home))
    try:
        out = d500(home, "op", "bench", "submissions/numpy-im2col-conv", "--case",
                   "levels/0-operators/conv-3x3-stride2.yaml", "--backends", "reference",
                   "--budget", "0.1")
        assert out.returncode == 0, out.stderr
        net = tmp / "tiny.yaml"
        net.write_text(tiny_mlp(train=True, metrics=BENCH_METRICS))
        assert bench(net_workloads.load(net), ["reference", "onnxruntime"]).exit_code == 0
        ledger = Ledger()
        wl = workloads.load(ROOT / "levels" / "2-training" / "digits-mlp.yaml")
        entry = submission.load(ROOT / "submissions" / "sgd-momentum")
        seed = required(2, wl.name, entry.name, "torch", wl.seeds)[0]  # one the rules chose
        train(wl, entry.recipe, "torch", seed, ledger=ledger, submission=entry.name)
        ledger.close()
        run = jobs.train(home, 1, jobs.LEVEL3 / "digits-mlp.yaml", jobs.ENTRIES / "sync",
                         "--seeds", "1")
        assert run.returncode == 0, run.stderr[-3000:]
        yield home
    finally:
        mp.undo()


@pytest.mark.slow  # its module's runs of every level, then Chromium: 39 s at load 11
@pytest.mark.browser
def test_every_level_reads_at_1280_px_with_a_legend_and_the_summaries(every_level, tmp_path):
    from browser import chromium, decoded, page_width_problems
    from selenium.webdriver.common.by import By

    ledger = Ledger(every_level / "ledger.sqlite")
    assert {r["level"] for r in ledger.runs()} == {0, 1, 2, 3}
    page = leaderboard.write_html(tmp_path / "board.html", ledger)
    envs = leaderboard.Legend.of(leaderboard.build(ledger))
    ledger.close()
    cpu = provenance.collect()["cpu"]["model"]
    with chromium(tmp_path / "profile") as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return window.innerWidth") == 1280
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 1280
        assert page_width_problems(driver) == []

        images = driver.find_elements(By.TAG_NAME, "img")
        for level in (0, 1, 2, 3):
            section = driver.find_element(By.ID, f"level-{level}")
            assert section.find_elements(By.TAG_NAME, "img"), f"level {level} has no plot"
            boards = section.find_elements(By.CSS_SELECTOR, "table.board")
            assert boards, f"level {level} has no board"
            for board in boards:  # every row names its environments, linked to the legend
                heads = [th.text for th in board.find_elements(By.CSS_SELECTOR, "thead th")]
                assert heads[-1] == "env" and "provenance" not in heads
                for cell in board.find_elements(By.CSS_SELECTOR, "td.env"):
                    links = cell.find_elements(By.TAG_NAME, "a")
                    assert links and all(re.fullmatch(r"#env-E\d+", a.get_attribute("hash"))
                                         for a in links), cell.text
                assert cpu not in board.text  # provenance is the legend's, not the rows'
        assert len(images) >= 6 and all(decoded(driver, img) for img in images)

        legend = driver.find_element(By.ID, "environments")
        rows = legend.find_elements(By.CSS_SELECTOR, "table.legend tbody tr")
        assert [r.get_attribute("id") for r in rows] == [
            f"env-{item.label}" for item in envs.items] and rows[0].get_attribute("id") == "env-E1"
        assert all(cpu in r.text and "GiB" in r.text and "Python" in r.text for r in rows)
        assert driver.find_elements(By.CSS_SELECTOR, "td.env a[href='#env-E1']")
        targets = {a.get_attribute("hash") for a in driver.find_elements(By.CSS_SELECTOR,
                                                                          "td.env a")}
        assert targets == {f"#{r.get_attribute('id')}" for r in rows}  # each used, each there

        for level, want in ((0, {("numpy-im2col-conv", "numpy"), ("builtin", "reference")}),
                            (1, {("reference",), ("onnxruntime",)})):
            section = driver.find_element(By.ID, f"level-{level}")
            [summary] = [v for v in section.find_elements(By.CSS_SELECTOR, "section.view")
                         if v.find_element(By.TAG_NAME, "h3").text.startswith(
                             "Organiser's summary")]
            got = {tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td"))[:len(next(
                iter(want)))] for tr in summary.find_elements(By.CSS_SELECTOR, "tbody tr")}
            assert got == want, got
            # one workload: the profile is the table (its ρ(τ) plot would be one jump a row)
            assert not summary.find_elements(By.TAG_NAME, "img")
            assert "one workload: no ρ(τ) plot" in summary.text

        winners = driver.find_element(By.ID, "winners")  # who won, above every table
        first = min(t.rect["y"] for t in driver.find_elements(By.CSS_SELECTOR,
                                                               "section.level table"))
        assert winners.rect["y"] + winners.rect["height"] <= first
        assert [h.text for h in winners.find_elements(By.TAG_NAME, "h3")] == [
            "level 0: operators", "level 1: networks", "level 2: training",
            "level 3: distributed"]
        assert len(winners.find_elements(By.CSS_SELECTOR, "td.winner")) >= 4

        driver.set_window_size(700, 900)  # narrower still: rows stack, nothing overflows
        assert driver.execute_script("return window.innerWidth") <= 700
        assert page_width_problems(driver) == []


def two_machines(home: Path, tmp_path: Path) -> Ledger:
    """This machine's runs and, imported from relay records whose provenance names another CPU
    with 16 cores, another machine's: a latency board and an accuracy board."""
    gemm = tmp_path / "gemm.yaml"
    gemm.write_text("name: gemm\nlevel: 0\nmetrics: [latency, forward_error]\nrank_by: latency\n")
    acc = tmp_path / "acc.yaml"
    acc.write_text(textwrap.dedent("""\
        name: acc
        level: 2
        metrics: [test_accuracy, time_to_accuracy, epochs]
        rank_by: test_accuracy
    """))
    ledger = Ledger(home / "ledger.sqlite")
    for sub, latency in (("fast", 1e-3), ("slow", 3e-3)):
        ledger.start_run(level=0, workload="gemm", submission=sub, backend="numpy",
                         workload_file=gemm).finish("succeeded", figures={
                             "latency": latency, "forward_error": 1e-7})
    ledger.start_run(level=2, workload="acc", submission="here", backend="torch",
                     seed=required(2, "acc", "here", "torch", 1)[0],  # the rules' seed
                     workload_file=acc).finish("succeeded", figures={
                         "test_accuracy": 0.90, "time_to_accuracy": 5.0, "epochs": 4})
    relay = Relay()
    relay.start_run(level=0, workload="gemm", submission="other", backend="numpy",
                    workload_file=gemm).finish("succeeded", figures={
                        "latency": 5e-4, "forward_error": 2e-7})
    relay.start_run(level=2, workload="acc", submission="there", backend="torch",
                    seed=required(2, "acc", "there", "torch", 1)[0],
                    workload_file=acc).finish("succeeded", figures={
                        "test_accuracy": 0.95, "time_to_accuracy": 9.0, "epochs": 3})
    while relay.finished:
        record = relay.take()
        record["provenance"]["cpu"].update(model=OTHER_CPU, logical_cores=16)
        ledger.import_run(record)
    return ledger


def test_times_from_two_machines_are_ranked_apart_unless_across_machines(tmp_path,
                                                                          monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    ledger = two_machines(home, tmp_path)
    here = provenance.collect()["cpu"]["model"]

    gemm, acc = leaderboard.build(ledger)  # level 0, then level 2
    assert (gemm.workload, acc.workload) == ("gemm", "acc")
    assert gemm.per_machine and len(gemm.machines) == 2
    ranks = {e.submission: (e.rank, e.ratio) for e in gemm.entries}
    assert ranks == {"fast": (1, 1.0), "slow": (2, 3.0), "other": (1, 1.0)}  # per machine
    assert not acc.per_machine  # accuracy compares across machines
    assert [(e.submission, e.rank) for e in acc.entries] == [("there", 1), ("here", 2)]
    [across] = [b for b in leaderboard.build(ledger, across_machines=True) if b.workload == "gemm"]
    assert [(e.submission, e.rank) for e in across.entries] == [
        ("other", 1), ("fast", 2), ("slow", 3)]
    assert across.entries[1].ratio == 2.0
    ledger.close()

    md = d500(home, "leaderboard")
    assert md.returncode == 0, md.stderr
    text = md.stdout
    board = text.split("### level 0 · gemm")[1].split("## level 2")[0]
    assert "each machine's rows are ranked apart" in board and "--across-machines" in board
    assert "machine-dependent (times, rates and ratios of times: compare rows of the same " \
           "hardware only): latency; comparable across machines: forward_error" in board
    first, second = board.split(f"**on {OTHER_CPU} ×16 logical cores")
    assert f"**on {here} ×" in first and "(E1): ranked among these rows**" in first
    assert "| 1 | fast | numpy | 1 ms (n=1) | 1.00× |" in first
    assert "| 2 | slow | numpy | 3 ms (n=1) | 3.00× |" in first and "| other |" not in first
    assert "| 1 | other | numpy | 500 µs (n=1) | 1.00× |" in second and "| E2 |" in second
    accuracy = text.split("### level 2 · acc")[1].split("## Environments")[0]
    assert "ranked together by test_accuracy, which is comparable on any machine" in accuracy
    assert "machine-dependent (times, rates and ratios of times: compare rows of the same " \
           "hardware only): time_to_accuracy; comparable across machines: test_accuracy, " \
           "epochs" in accuracy
    assert re.search(r"\| 1 \| there \| torch \| 0\.9500 .*\| E2 \|\n\| 2 \| here \| torch \| "
                     r"0\.9000 .*\| E1 \|", accuracy)
    legend = text.split("## Environments")[1]
    assert f"| E1 | {here} ×" in legend and f"| E2 | {OTHER_CPU} ×16 logical cores" in legend
    assert "2 machines: E1 on" in legend and "never ranked against each other" in legend
    # the section heading, the machines note, the legend, and the levels' views of that machine
    # (level 0's summary; level 2's seeds and performance profile): times are never pooled
    assert text.count(OTHER_CPU) == 6

    flag = d500(home, "leaderboard", "--across-machines")
    assert flag.returncode == 0, flag.stderr
    board = flag.stdout.split("### level 0 · gemm")[1].split("## level 2")[0]
    assert "ranked together by latency because the organiser asked " \
           "(d500 leaderboard --across-machines): these times come from different hardware" \
           in board
    assert re.search(r"\| 1 \| other \| numpy \| 500 µs .*\| E2 \|\n\| 2 \| fast \| numpy \| "
                     r"1 ms \(n=1\) \| 2\.00× .*\| E1 \|\n\| 3 \| slow ", board), board
    assert "ranked among these rows" not in flag.stdout
    assert "ranked against each other here, as the organiser asked" in flag.stdout

    term = d500(home, "leaderboard", "--format", "terminal", "--level", "0")
    assert term.returncode == 0, term.stderr
    assert re.search(r"│ +1 │ other +│ numpy +│ +500 µs \(n=1\) │ +1\.00× │.*│ E2 +│",
                     term.stdout), term.stdout
    assert f"section 2 of 2: on {OTHER_CPU} ×16 logical cores" in term.stdout
    assert "─ Environments ─" in term.stdout


@pytest.mark.browser
def test_two_machines_in_html_a_section_each_and_readable_at_1280_px(tmp_path, monkeypatch):
    from browser import chromium, decoded, page_width_problems
    from selenium.webdriver.common.by import By

    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    ledger = two_machines(home, tmp_path)
    names = [n for n in metrics.names() if metrics.get(n).missing is None][:22]
    wide = tmp_path / "wide.yaml"  # 22 metrics, 30 columns: cells may break anywhere to fit
    wide.write_text(f"name: wide\nlevel: 0\nmetrics: [{', '.join(names)}]\nrank_by: latency\n")
    ledger.start_run(level=0, workload="wide", submission="many-figures-submission",
                     backend="numpy", workload_file=wide).finish(
        "succeeded", figures={n: 123456.789 for n in names})
    page = leaderboard.write_html(tmp_path / "board.html", ledger, level=0)
    ledger.close()
    with chromium(tmp_path / "profile") as driver:
        driver.get(page.as_uri())
        assert page_width_problems(driver) == []
        [wide_board] = driver.find_elements(By.CSS_SELECTOR, "table.board.wide")
        assert len(wide_board.find_elements(By.CSS_SELECTOR, "thead th")) == 30
        board = driver.find_element(By.CSS_SELECTOR, "section.workload table.board")
        bodies = board.find_elements(By.TAG_NAME, "tbody")
        assert len(bodies) == 2
        heading = [b.find_element(By.CSS_SELECTOR, "tr.machine th").text for b in bodies]
        assert heading[1].startswith(f"on {OTHER_CPU} ×16 logical cores") and "(E2)" in heading[1]
        ranks = [[(tr.find_elements(By.TAG_NAME, "td")[0].text,
                   tr.find_elements(By.TAG_NAME, "td")[1].text)
                  for tr in b.find_elements(By.CSS_SELECTOR, "tr:not(.machine)")] for b in bodies]
        assert ranks == [[("1", "fast"), ("2", "slow")], [("1", "other")]]
        strip = driver.find_element(By.CSS_SELECTOR, "section.workload img")
        assert decoded(driver, strip) and "one panel per machine" in strip.get_attribute("alt")
        assert driver.find_element(By.ID, "env-E2").text.startswith(f"E2 {OTHER_CPU}")


def test_an_imported_package_shows_its_entry_and_the_forced_mark(tmp_path, monkeypatch):
    from d500.competition.export import build

    other = tmp_path / "other-home"
    monkeypatch.setenv("D500_HOME", str(other))
    theirs = two_machines(other, tmp_path)  # their ledger: "other" ran on the other machine
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "submission.yaml").write_text("name: other\n")
    package = build(entry, tmp_path / "other.tar.gz", ledger=theirs)
    theirs.close()

    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    gemm = tmp_path / "gemm.yaml"
    ours = Ledger()
    ours.start_run(level=0, workload="gemm", submission="other", backend="numpy",
                   workload_file=gemm).finish("succeeded", figures={"latency": 2e-3})
    ours.close()
    result = d500(home, "ledger", "import", str(package), "--force")
    assert result.returncode == 0, result.stderr  # gemm.yaml is in no rulebook: forced
    ledger = Ledger()
    [board] = [b for b in leaderboard.build(ledger) if b.workload == "gemm"]
    mine, imported = sorted(board.entries, key=lambda e: e.package is not None)
    assert mine.package is None and imported.package["forced"] is True
    # a forced import is listed with its mark but never ranked (issue 17: it never outranks)
    assert (mine.rank, imported.rank) == (1, None)
    md = leaderboard.render(ledger, fmt="md", level=0)
    ledger.close()
    sha = imported.package["sha256"][:8]
    assert re.search(rf"\| — \| other · package other {sha} ⚠ forced \(failed d500 check\) \| "
                     rf"numpy \| 500 µs .*\| E\d \|", md), md
    assert re.search(r"\| 1 \| other \| numpy \| 2 ms ", md)  # our own run: no mark
