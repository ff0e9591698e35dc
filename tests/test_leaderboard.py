"""Leaderboards read from the ledger alone: grouping, aggregation, ranking, the levels' views,
and the Markdown, terminal and HTML renderers."""

from __future__ import annotations

import base64
import io
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from d500 import cli, leaderboard, levels, provenance, threads
from d500.errors import Diverged
from d500.leaderboard import text
from d500.ledger import Ledger
from d500.training.seeds import required

ROOT = Path(__file__).resolve().parent.parent

# A level of our own, to check that a registered level's views reach every renderer. It claims
# a number no real level uses and, like a real level module, imports only d500.levels at the top.
TEST_LEVEL = """
from d500.levels import Level, View


class SummaryLevel(Level):
    number, name, folder = 7, "summary", "7-summary"

    def views(self, boards, ledger):
        from d500.leaderboard import plots
        fig = plots.figure(3, 2)
        fig.add_subplot().bar(range(len(boards)), [len(b.entries) for b in boards])
        rows = [[b.workload, str(len(b.entries)),
                 str(len(ledger.runs(level=7, workload=b.workload)))] for b in boards]
        return [View("entries per workload", ["workload", "entries", "runs"], rows,
                     [("entries per workload, as bars", plots.png(fig))],
                     ["a note from level 7"])]


LEVEL = SummaryLevel()
"""


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    # runs recorded here and in a fresh process (kill_mid_run) record the same thread setting:
    # none, whatever an earlier test in this process configured (another count: another row)
    monkeypatch.setattr(threads, "_setting", None)
    return tmp_path / "home"


def register_level(folder: Path, monkeypatch, module: str, text: str) -> None:
    """The level of source `text`, written as module `module` in the new `folder`, registered
    beside the real levels (until the test ends)."""
    folder.mkdir()
    (folder / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(levels, "REGISTERED", [*levels.REGISTERED, module])


@pytest.fixture
def test_level(tmp_path, monkeypatch) -> None:
    """Register TEST_LEVEL (level 7) as a module of its own, beside the real levels."""
    register_level(tmp_path / "test-level", monkeypatch, "d500_test_level", TEST_LEVEL)


def decoded_pngs(data_uris: list[str]) -> list[tuple[int, int]]:
    """Decode base64 PNGs; each must carry the PNG signature and open in PIL and matplotlib."""
    from matplotlib import image
    from PIL import Image

    sizes = []
    for b64 in data_uris:
        data = base64.b64decode(b64, validate=True)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            assert img.format == "PNG"
            sizes.append(img.size)
        pixels = image.imread(io.BytesIO(data), format="png")
        assert pixels.shape[:2] == sizes[-1][::-1] and pixels.std() > 0  # not a blank image
    return sizes


def write_workload(path: Path, metrics: list[str], rank_by: str | None = None,
                   aggregate: str = "median", level: int = 0) -> Path:
    text = f"name: {path.stem}\nlevel: {level}\nmetrics: [{', '.join(metrics)}]\n"
    text += f"aggregate: {aggregate}\n" + (f"rank_by: {rank_by}\n" if rank_by else "")
    path.write_text(text)
    return path


def rules_seed(level: int, wf: Path, submission: str, backend: str, i: int) -> int:
    """Seed i of a level-2/3 entry as the rules choose it (only those score), else i."""
    return required(level, wf.stem, submission, backend, i + 1)[i] if level in (2, 3) else i


def record(ledger: Ledger, wf: Path, submission: str, backend: str, figures: dict | None,
           seed: int = 0, level: int = 0, status: str = "succeeded", files=()) -> None:
    run = ledger.start_run(level=level, workload=wf.stem, submission=submission,
                           backend=backend, seed=rules_seed(level, wf, submission, backend, seed),
                           workload_file=wf,
                           submission_files=list(files))
    run.finish(status, figures=figures, error=None if status == "succeeded" else status)


def kill_mid_run(home: Path, wf: Path, submission: str, backend: str, level: int) -> None:
    """A real process that starts a run and is SIGKILLed before finishing it."""
    code = textwrap.dedent(f"""
        import os, signal
        from d500.ledger import Ledger
        run = Ledger().start_run(level={level}, workload={wf.stem!r}, submission={submission!r},
                                 backend={backend!r}, workload_file={str(wf)!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    provenance.peak_flops()
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "D500_HOME": str(home)},
                   cwd=ROOT, timeout=120, check=False)


def test_ranks_by_direction_with_median_and_ratio(home, tmp_path):
    wf = write_workload(tmp_path / "gemm.yaml", ["latency", "throughput"], rank_by="throughput")
    ledger = Ledger()
    for seed, thr in enumerate([100.0, 90.0, 500.0]):  # median 100, not the best 500
        record(ledger, wf, "blocked", "numpy", {"throughput": thr, "latency": 1 / thr}, seed)
    for seed, thr in enumerate([210.0, 200.0, 190.0]):
        record(ledger, wf, "blocked", "torch", {"throughput": thr, "latency": 1 / thr}, seed)
    record(ledger, wf, "naive", "numpy", None, status="failed")
    [board] = leaderboard.build(ledger)
    assert board.rank_by.name == "throughput" and board.how == "median"
    order = [(e.submission, e.backend) for e in board.entries]
    assert order == [("blocked", "torch"), ("blocked", "numpy"), ("naive", "numpy")]
    torch_e, numpy_e, naive = board.entries
    assert torch_e.aggregate["throughput"] == 200.0 and numpy_e.aggregate["throughput"] == 100.0
    assert numpy_e.spread["throughput"] == (90.0, 500.0)
    assert (torch_e.rank, torch_e.ratio) == (1, 1.0)
    assert (numpy_e.rank, numpy_e.ratio) == (2, 2.0)
    assert naive.rank is None and naive.counts["failed"] == 1
    assert [r["status"] for r in board.not_succeeded] == ["failed"]
    md = leaderboard.render(ledger, fmt="md")
    assert "| 1 | blocked | torch | 200.0 samples/s" in md
    assert "| 2 | blocked | numpy | 100.0 samples/s [90.0 – 500.0] (n=3) | 2.00× |" in md
    assert "| — | naive | numpy |" in md and "1 failed" in md
    assert "Runs not counted as success (1)" in md


def test_olympic_mean_missed_targets_and_interrupted_runs(home, tmp_path):
    wf = write_workload(tmp_path / "mnist.yaml", ["time_to_accuracy", "test_accuracy"],
                        aggregate="olympic_mean", level=2)
    wf.write_text(wf.read_text() + "seeds: 5\n")  # the rules' 5 seeds score
    ledger = Ledger()
    for seed, tta in enumerate([10.0, 11.0, 12.0, 13.0, 100.0]):
        record(ledger, wf, "adam", "torch", {"time_to_accuracy": tta, "test_accuracy": 0.9},
               seed, level=2)
    # sgd: two runs met the target, one missed it (no figure), one diverged
    record(ledger, wf, "sgd", "torch", {"time_to_accuracy": 8.0}, 0, level=2)
    record(ledger, wf, "sgd", "torch", {"time_to_accuracy": 9.0}, 1, level=2)
    record(ledger, wf, "sgd", "torch", {"test_accuracy": 0.5}, 2, level=2)
    with pytest.raises(Diverged), ledger.start_run(
            level=2, workload="mnist", submission="sgd", backend="torch",
            seed=rules_seed(2, wf, "sgd", "torch", 3),
            workload_file=wf):
        raise Diverged("loss is nan")
    kill_mid_run(home, wf, "sgd", "torch", level=2)
    [board] = leaderboard.build(Ledger())
    adam, sgd = board.entries
    assert adam.submission == "adam"
    assert adam.aggregate["time_to_accuracy"] == pytest.approx(12.0)  # 10 and 100 dropped
    assert sorted(sgd.values["time_to_accuracy"]) == [8.0, 9.0, math.inf, math.inf]
    assert sgd.aggregate["time_to_accuracy"] == math.inf  # olympic mean of [9, inf]
    assert sgd.counts == {"succeeded": 3, "diverged": 1, "interrupted": 1}
    assert sgd.ratio == math.inf
    md = leaderboard.markdown([board])
    assert "3 succeeded 1 diverged 1 interrupted (1 missed the target)" in md
    assert "| 2 | sgd | torch | ∞ [8 s – ∞] (n=4) | ∞ |" in md
    assert "olympic mean" in md
    statuses = sorted(r["status"] for r in board.not_succeeded)
    assert statuses == ["diverged", "interrupted"]


def test_reads_only_the_ledger_and_shows_verify(home, tmp_path):
    wf = write_workload(tmp_path / "conv.yaml", ["latency", "gflops"])
    code = tmp_path / "conv_op.py"
    code.write_text("X = 1\n")
    ledger = Ledger()
    record(ledger, wf, "mine", "numpy", {"latency": 2e-3, "gflops": 1.0}, files=[code])
    record(ledger, wf, "theirs", "numpy", {"latency": 1e-3, "gflops": 2.0})
    wf.unlink()  # the rules live on in the ledger
    code.write_text("X = 2\n")  # edited after its run
    [board] = leaderboard.build(ledger)
    assert board.rank_by.name == "latency"
    theirs, mine = board.entries
    assert (theirs.submission, theirs.rank, mine.rank) == ("theirs", 1, 2)
    assert any(f"submission file {code} changed" in p for p in mine.problems)
    assert any("workload file" in p and "missing" in p for p in theirs.problems)
    md = leaderboard.markdown([board])
    assert "✗ 2 problem(s)" in md and "Integrity problems" in md
    legend = leaderboard.Legend.of([board])
    assert legend.labels(mine) == legend.labels(theirs) == ["E1"]  # one environment, once
    [(label, prov)] = text.legend_rows(legend)
    here = provenance.collect()
    assert label == "E1" and here["cpu"]["model"] in prov and "numpy " in prov
    assert f"Python {here['python']}" in prov and here["os"] in prov
    assert "## Environments" in md and md.count(here["cpu"]["model"]) == 1
    assert md.count("| E1 |") == 3  # two rows and the legend's


def test_changed_rules_are_ranked_apart(home, tmp_path):
    wf = write_workload(tmp_path / "net.yaml", ["latency"])
    ledger = Ledger()
    record(ledger, wf, "a", "torch", {"latency": 1.0})
    write_workload(wf, ["latency", "throughput"])
    record(ledger, wf, "a", "torch", {"latency": 2.0, "throughput": 3.0})
    boards = leaderboard.build(ledger)
    assert len(boards) == 2 and all(b.version_note for b in boards)
    assert [len(b.metrics) for b in boards] == [2, 1]  # newest rules first


def test_different_models_under_one_name_are_ranked_apart(home, tmp_path):
    ledger = Ledger()
    for content, latency in (("model one", 1.0), ("model two", 5.0), ("model one", 3.0)):
        model = tmp_path / "model.onnx"  # `net check` names its runs after the file's stem
        model.write_text(content)
        ledger.start_run(level=1, workload="check:model", submission="torch", backend="torch",
                         model_file=model).finish("succeeded", figures={"latency": latency})
    boards = leaderboard.build(ledger)
    assert len(boards) == 2 and all("the model changed" in b.version_note for b in boards)
    medians = sorted(b.entries[0].aggregate["latency"] for b in boards)
    assert medians == [2.0, 5.0]  # never the median over two different models


def test_cli_markdown_html_terminal_and_errors(home, tmp_path, capsys):
    """`d500 leaderboard` as a process once (its --help), then each call through cli.main, the
    function that process runs, in this one (a process each: about 1.3 s apiece)."""
    wf = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(Ledger(), wf, "mine", "numpy", {"latency": 2e-3})
    env = {**os.environ, "D500_HOME": str(home)}
    shown = subprocess.run([sys.executable, "-m", "d500.cli", "leaderboard", "--help"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                           check=False)
    assert shown.returncode == 0 and "--format {md,html,terminal}" in shown.stdout

    def d500(*args):
        capsys.readouterr()
        code = cli.main(["leaderboard", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["d500", "leaderboard", *args], code, out, err)
    md = d500("--level", "0")
    assert md.returncode == 0 and "| 1 | mine | numpy | 2 ms" in md.stdout
    assert "No runs recorded yet." in d500("--level", "3").stdout
    html = d500("--format", "html")
    assert html.returncode == 0 and (home / "leaderboard.html").is_file()
    out = tmp_path / "lb.html"
    assert d500("--format", "html", "--out", str(out)).returncode == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page  # self-contained
    decoded_pngs(re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page))
    term = d500("--format", "terminal")
    assert term.returncode == 0 and "level 0 · conv" in term.stdout
    assert re.search(r"│ +1 │ mine +│ numpy +│ +2 ms \(n=1\) │", term.stdout), term.stdout
    assert "ranked by latency (lower is better)" in term.stdout
    plain = tmp_path / "lb.txt"
    assert d500("--format", "terminal", "--out", str(plain)).returncode == 0
    assert "level 0 · conv" in plain.read_text() and "\x1b[" not in plain.read_text()
    bad = d500("--format", "pdf")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "pdf" in bad.stderr
    (tmp_path / "a-file").write_text("")
    for fmt in ("md", "html", "terminal"):
        bad = d500("--format", fmt, "--out", str(tmp_path / "a-file" / "lb"))
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert "cannot write it" in bad.stderr
    nested = tmp_path / "new" / "folder" / "lb.md"
    assert d500("--out", str(nested)).returncode == 0 and nested.is_file()
    missing = d500("--ledger", str(tmp_path / "no-such.sqlite"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    for args in (["--workload", "cnov"], ["--level", "1", "--workload", "conv"]):
        typo = d500(*args)  # runs are recorded, none of that workload: not "no runs yet"
        assert typo.returncode == 2 and typo.stderr.count("\n") == 1, typo.stderr
        assert f"--workload '{args[-1]}': no run of it" in typo.stderr
    assert "at level 1 in" in typo.stderr and "No runs recorded yet." not in typo.stdout
    assert "(its workloads: conv; did you mean 'conv'?)" in d500("--workload", "cnov").stderr
    assert d500("--level", "0", "--workload", "conv").returncode == 0


@pytest.mark.browser
def test_html_renders_in_headless_chromium(home, tmp_path, test_level):
    from browser import chromium, decoded
    from selenium.webdriver.common.by import By

    ledger = Ledger()
    wf = write_workload(tmp_path / "mnist.yaml", ["time_to_accuracy", "val_accuracy"], level=2)
    for sub, base in (("sgd", 10.0), ("adam", 7.0)):
        for seed in range(3):
            with ledger.start_run(level=2, workload="mnist", submission=sub, backend="torch",
                                  seed=rules_seed(2, wf, sub, "torch", seed),
                                  workload_file=wf) as run:
                for epoch in range(3):
                    run.evaluation(step=epoch, epoch=epoch, wall_time=base * epoch / 2,
                                   metrics={"val_accuracy": 0.6 + 0.1 * epoch})
                run.record(figures={"time_to_accuracy": base + seed, "val_accuracy": 0.8})
    record(ledger, wf, "broken", "torch", None, level=2, status="failed")
    wc = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(ledger, wc, "im2col", "numpy", {"latency": 1e-3})
    w7 = write_workload(tmp_path / "seven.yaml", ["latency"], level=7)
    record(ledger, w7, "x", "torch", {"latency": 1e-3}, level=7)
    page = leaderboard.write_html(tmp_path / "board.html", ledger)

    with chromium(tmp_path / "profile") as driver:
        driver.get(page.as_uri())
        assert driver.title == "d500 leaderboard"
        sections = driver.find_elements(By.CSS_SELECTOR, "section.workload")
        assert [s.find_element(By.TAG_NAME, "h2").text for s in sections] == [
            "level 0 · conv", "level 2 · mnist", "level 7 · seven"]
        rows = sections[1].find_elements(By.CSS_SELECTOR, "table.board tbody tr")
        cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
        assert [c[:3] for c in cells] == [["1", "adam", "torch"], ["2", "sgd", "torch"],
                                          ["3", "broken", "torch"]]  # failed: ∞ time
        assert cells[0][3].startswith("8 s") and cells[1][4] == "1.38×"
        assert cells[2][3].startswith("∞") and cells[2][4] == "∞"
        excluded = sections[1].find_elements(By.CSS_SELECTOR, "table.excluded tbody tr")
        assert len(excluded) == 1 and "failed" in excluded[0].text
        images = driver.find_elements(By.CSS_SELECTOR, "section.workload img")
        assert len(images) == 4  # conv, mnist and seven strip plots; mnist accuracy curves
        level7 = driver.find_element(By.ID, "level-7")
        assert level7.find_element(By.TAG_NAME, "h2").text == "level 7: summary"
        view = level7.find_element(By.CSS_SELECTOR, "section.view")
        assert view.find_element(By.TAG_NAME, "h3").text == "entries per workload"
        assert [td.text for td in view.find_elements(By.CSS_SELECTOR, "table.view td")] == [
            "seven", "1", "1"]
        images += view.find_elements(By.TAG_NAME, "img")
        assert len(images) == 5
        assert all(decoded(driver, img) for img in images)


def test_tuning_trials_are_counted_beside_the_ranked_runs(home, tmp_path):
    wf = write_workload(tmp_path / "mnist.yaml", ["val_accuracy"], level=2)
    ledger = Ledger()
    with ledger.start_study("sweep", 2, "mnist", "sgd", "torch", "val_accuracy") as study:
        for lr in (0.01, 0.1, 10.0):
            run = study.trial({"lr": lr}, workload_file=wf)
            run.finish("diverged" if lr > 1 else "succeeded",
                       figures=None if lr > 1 else {"val_accuracy": 0.99})
    record(ledger, wf, "sgd", "torch", {"val_accuracy": 0.8}, level=2)
    [board] = leaderboard.build(ledger)
    [entry] = board.entries
    assert len(entry.trials) == 3 and len(entry.runs) == 1
    assert entry.aggregate["val_accuracy"] == 0.8  # the final run, not the best trial
    md = leaderboard.markdown([board])
    assert "| 1 | sgd | torch | 0.8000 (n=1) | 1.00× | 1 succeeded | 3 (" in md
    assert "| 3 | sgd | torch | diverged |  | trial |" in md


def test_level_views_reach_markdown_terminal_and_html(home, tmp_path, test_level, capsys):
    ledger = Ledger()
    w7 = write_workload(tmp_path / "seven.yaml", ["latency"], level=7)
    for backend, latency in (("torch", 1e-3), ("torch", 3e-3), ("tensorflow", 2e-3)):
        record(ledger, w7, "mine", backend, {"latency": latency}, level=7)
    w8 = write_workload(tmp_path / "eight.yaml", ["latency"], level=8)  # no level claims 8
    record(ledger, w8, "other", "torch", {"latency": 5e-3}, level=8)
    boards = leaderboard.build(ledger)
    [seven, eight] = leaderboard.parts(boards, ledger)
    assert (seven.title, [b.workload for b in seven.boards]) == ("level 7: summary", ["seven"])
    assert (eight.title, eight.views) == ("level 8", [])  # generic: boards only

    md = leaderboard.render(ledger, fmt="md")
    part7, part8 = md.split("## level 7: summary\n")[1].split("## level 8\n")
    assert part7.index("### entries per workload") < part7.index("### level 7 · seven")
    assert "| workload | entries | runs |" in part7 and "| seven | 2 | 3 |" in part7
    assert "_a note from level 7_" in part7
    assert "_plot: entries per workload, as bars (PNG 300×200 px;" in part7  # --out: a file
    assert "### level 8 · eight" in part8 and "entries per workload" not in part8

    term = leaderboard.render(ledger, fmt="terminal")
    term = term[term.index("─ level 7: summary ─"):]  # its part's rule, after the winners
    assert term.index("level 7: summary") < term.index("entries per workload") < term.index(
        "level 7 · seven") < term.index("level 8") < term.index("level 8 · eight")
    assert re.search(r"│ seven +│ 2 +│ 3 +│", term) and "a note from level 7" in term
    assert "plot: entries per workload, as bars (PNG 300×200 px" in term
    assert term.count("entries per workload") == 2  # the view's table and its plot, once
    assert cli.main(["leaderboard", "--format", "terminal", "--level", "3"]) == 0
    assert "No runs recorded yet." in capsys.readouterr().out

    page = leaderboard.render(ledger, fmt="html")
    section = page.split("<section class='level' id='level-7'>")[1].split(
        "<section class='level' id='level-8'>")[0]
    assert section.index("<h3>entries per workload</h3>") < section.index(
        "<h2>level 7 · seven</h2>")
    assert "<table class='view'><thead><tr><th>workload</th><th>entries</th><th>runs</th>" \
           "</tr></thead><tbody><tr><td data-label='workload'>seven</td>" \
           "<td data-label='entries'>2</td><td data-label='runs'>3</td></tr>" in section
    assert "<p class='note'>a note from level 7</p>" in section
    [view_png] = re.findall(r"<img alt='entries per workload, as bars' "
                            r"src='data:image/png;base64,([^']+)'>", section)
    assert decoded_pngs([view_png]) == [(300, 200)]
    strip = re.findall(r"data:image/png;base64,([^']+)'", section)
    assert len(strip) == 2 and decoded_pngs(strip)[1] == (700, 140)  # 0.5 + 0.45 * 2 in


def test_a_stored_workload_that_no_longer_reads_as_rules_is_shown_unranked(
        home, tmp_path, monkeypatch):
    metrics = tmp_path / "my-metrics"
    metrics.mkdir()
    (metrics / "score.py").write_text(textwrap.dedent("""
        NAME = "score"
        UNIT = ""
        DIRECTION = "higher"
        AGGREGATE = "median"
        MISSING = None
        FORMAT = ".2f"
        MEASURED = "a score of our own"
    """))
    monkeypatch.setenv("D500_METRICS", str(metrics))
    wf = write_workload(tmp_path / "scored.yaml", ["score", "latency"], rank_by="score")
    ledger = Ledger()
    record(ledger, wf, "a", "numpy", {"score": 2.0, "latency": 1e-3})
    record(ledger, wf, "b", "numpy", {"score": 3.0, "latency": 2e-3})
    assert [e.rank for e in leaderboard.build(ledger)[0].entries] == [1, 2]
    monkeypatch.delenv("D500_METRICS")  # the metric file is gone: the stored rules name it
    [board] = leaderboard.build(ledger)
    assert "unknown metric 'score'" in board.rules_problem and "scored.yaml" in board.rules_problem
    assert board.rank_by is None and [m.name for m in board.metrics] == ["latency"]
    assert [(e.submission, e.rank, e.ratio) for e in board.entries] == [
        ("a", None, None), ("b", None, None)]
    assert board.entries[1].aggregate["latency"] == 2e-3
    md = leaderboard.markdown([board])
    assert "unranked: the workload file recorded with these runs no longer reads as rules" in md
    assert "| — | b | numpy | 2 ms (n=1) | 1 succeeded |" in md


def test_compact_table_and_boards_for_as_d500_run_prints_them(home, tmp_path):
    from rich.console import Console

    wf = write_workload(tmp_path / "net.yaml", ["latency"])
    ledger = Ledger()
    record(ledger, wf, "torch", "torch", {"latency": 9.0})  # an older version of the rules
    write_workload(wf, ["latency", "throughput"])
    for seed, latency in enumerate((1.0, 3.0)):
        record(ledger, wf, "torch", "torch", {"latency": latency, "throughput": 8.0}, seed)
    record(ledger, wf, "onnxruntime", "onnxruntime", {"latency": 4.0, "throughput": 2.0})
    wc = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(ledger, wc, "im2col", "numpy", {"latency": 1e-3})
    boards = leaderboard.boards_for(ledger, [(0, "net"), (0, "conv"), (0, "net"), (1, "net"),
                                             (0, "nothing")])
    assert [(b.workload, len(b.metrics)) for b in boards] == [("net", 2), ("conv", 1)]
    net, conv = boards
    assert [e.aggregate["latency"] for e in net.entries] == [2.0, 4.0]  # not the old 9.0

    def shown(table):
        console = Console(file=io.StringIO(), width=200, color_system=None)
        console.print(table)
        return console.file.getvalue()
    compact = shown(leaderboard.table(net, compact=True))
    assert [c.header.plain for c in leaderboard.table(net, compact=True).columns] == [
        "rank", "backend", "latency (s) ↓", "× best", "throughput (samples/s) ↑", "runs",
        "verify"]  # submission = backend: no submission column; no trials, no provenance
    assert re.search(r"│ +1 │ torch +│ 2 s \[1 s – 3 s\] │ +1\.00× │ +8\.0 samples/s │", compact)
    assert "(n=" not in compact and compact.startswith("level 0 · net")
    assert text.rule_line(net).split(";")[0] in compact.replace("\n", " ")
    full = leaderboard.table(net)
    assert [c.header.plain for c in full.columns][-4:] == ["runs", "tuning trials", "verify",
                                                            "env"]
    assert "(n=2)" in shown(full) and "submission" in shown(full)
    assert "submission" in shown(leaderboard.table(conv, compact=True))  # im2col on numpy



def test_out_naming_an_html_file_writes_the_html_page(home, tmp_path, capsys):
    """`--out board.html` without --format is the HTML page, not Markdown in an .html file;
    another name stays Markdown, and --format still decides when given."""
    wf = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(Ledger(), wf, "mine", "numpy", {"latency": 2e-3})
    for name, fmt, starts in (("b.html", [], "<!DOCTYPE html>"), ("b.HTM", [], "<!DOCTYPE html>"),
                              ("b.md", [], "# d500 leaderboard"),
                              ("c.html", ["--format", "md"], "# d500 leaderboard")):
        assert cli.main(["leaderboard", "--level", "0", "--out", str(tmp_path / name), *fmt]) == 0
        assert (tmp_path / name).read_text().startswith(starts), name
