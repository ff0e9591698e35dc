"""Leaderboards read from the ledger alone: grouping, aggregation, ranking, Markdown and HTML."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from d500 import leaderboard, provenance
from d500.errors import Diverged
from d500.ledger import Ledger

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_workload(path: Path, metrics: list[str], rank_by: str | None = None,
                   aggregate: str = "median", level: int = 0) -> Path:
    text = f"name: {path.stem}\nlevel: {level}\nmetrics: [{', '.join(metrics)}]\n"
    text += f"aggregate: {aggregate}\n" + (f"rank_by: {rank_by}\n" if rank_by else "")
    path.write_text(text)
    return path


def record(ledger: Ledger, wf: Path, submission: str, backend: str, figures: dict | None,
           seed: int = 0, level: int = 0, status: str = "succeeded", files=()) -> None:
    run = ledger.start_run(level=level, workload=wf.stem, submission=submission,
                           backend=backend, seed=seed, workload_file=wf,
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
                   cwd=ROOT, timeout=120)


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
    ledger = Ledger()
    for seed, tta in enumerate([10.0, 11.0, 12.0, 13.0, 100.0]):
        record(ledger, wf, "adam", "torch", {"time_to_accuracy": tta, "test_accuracy": 0.9},
               seed, level=2)
    # sgd: two runs met the target, one missed it (no figure), one diverged
    record(ledger, wf, "sgd", "torch", {"time_to_accuracy": 8.0}, 0, level=2)
    record(ledger, wf, "sgd", "torch", {"time_to_accuracy": 9.0}, 1, level=2)
    record(ledger, wf, "sgd", "torch", {"test_accuracy": 0.5}, 2, level=2)
    with pytest.raises(Diverged):
        with ledger.start_run(level=2, workload="mnist", submission="sgd", backend="torch",
                              seed=3, workload_file=wf):
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
    prov = mine.provenance[0]
    assert provenance.collect()["cpu"]["model"] in prov and "numpy" in prov


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
    for text, latency in (("model one", 1.0), ("model two", 5.0), ("model one", 3.0)):
        model = tmp_path / "model.onnx"  # `net check` names its runs after the file's stem
        model.write_text(text)
        ledger.start_run(level=1, workload="check:model", submission="torch", backend="torch",
                         model_file=model).finish("succeeded", figures={"latency": latency})
    boards = leaderboard.build(ledger)
    assert len(boards) == 2 and all("the model changed" in b.version_note for b in boards)
    medians = sorted(b.entries[0].aggregate["latency"] for b in boards)
    assert medians == [2.0, 5.0]  # never the median over two different models


def test_cli_markdown_html_and_errors(home, tmp_path):
    wf = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(Ledger(), wf, "mine", "numpy", {"latency": 2e-3})
    env = {**os.environ, "D500_HOME": str(home)}

    def d500(*args):
        return subprocess.run([sys.executable, "-m", "d500.cli", "leaderboard", *args],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    md = d500("--level", "0")
    assert md.returncode == 0 and "| 1 | mine | numpy | 2 ms" in md.stdout
    assert "No runs recorded yet." in d500("--level", "3").stdout
    html = d500("--format", "html")
    assert html.returncode == 0 and (home / "leaderboard.html").is_file()
    out = tmp_path / "lb.html"
    assert d500("--format", "html", "--out", str(out)).returncode == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "data:image/png;base64," in text
    assert "http://" not in text and "https://" not in text  # self-contained
    bad = d500("--format", "pdf")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    (tmp_path / "a-file").write_text("")
    for fmt in ("md", "html"):
        bad = d500("--format", fmt, "--out", str(tmp_path / "a-file" / "lb"))
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert "cannot write it" in bad.stderr
    nested = tmp_path / "new" / "folder" / "lb.md"
    assert d500("--out", str(nested)).returncode == 0 and nested.is_file()


@pytest.mark.browser
def test_html_renders_in_headless_chromium(home, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        assert Path(exe).is_file(), f"{exe} missing: run `make browser` (Debian chromium)"
    ledger = Ledger()
    wf = write_workload(tmp_path / "mnist.yaml", ["time_to_accuracy", "val_accuracy"], level=2)
    for sub, base in (("sgd", 10.0), ("adam", 7.0)):
        for seed in range(3):
            with ledger.start_run(level=2, workload="mnist", submission=sub, backend="torch",
                                  seed=seed, workload_file=wf) as run:
                for epoch in range(3):
                    run.evaluation(step=epoch, epoch=epoch, wall_time=base * epoch / 2,
                                   metrics={"val_accuracy": 0.6 + 0.1 * epoch})
                run.record(figures={"time_to_accuracy": base + seed, "val_accuracy": 0.8})
    record(ledger, wf, "broken", "torch", None, level=2, status="failed")
    wc = write_workload(tmp_path / "conv.yaml", ["latency"])
    record(ledger, wc, "im2col", "numpy", {"latency": 1e-3})
    page = leaderboard.write_html(tmp_path / "board.html", ledger)

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(page.as_uri())
        assert driver.title == "d500 leaderboard"
        sections = driver.find_elements(By.CSS_SELECTOR, "section.workload")
        assert [s.find_element(By.TAG_NAME, "h2").text for s in sections] == [
            "level 0 · conv", "level 2 · mnist"]
        rows = sections[1].find_elements(By.CSS_SELECTOR, "table.board tbody tr")
        cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
        assert [c[:3] for c in cells] == [["1", "adam", "torch"], ["2", "sgd", "torch"],
                                          ["3", "broken", "torch"]]  # failed: ∞ time
        assert cells[0][3].startswith("8 s") and cells[1][4] == "1.38×"
        assert cells[2][3].startswith("∞") and cells[2][4] == "∞"
        excluded = sections[1].find_elements(By.CSS_SELECTOR, "table.excluded tbody tr")
        assert len(excluded) == 1 and "failed" in excluded[0].text
        images = driver.find_elements(By.TAG_NAME, "img")
        assert len(images) == 3  # conv strip plot; mnist strip plot and accuracy curves
        for img in images:
            assert driver.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth", img) > 0
    finally:
        driver.quit()
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)


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
