"""The organiser's summary at the top of levels 0 and 1, from a ledger of real `op bench` and
`net bench` runs: each row's profile score, rho(tau), geomean and workload count checked against
values computed by hand from the recorded figures, in each workload's ranking direction, with
workloads an entry did not run counted as never within tau."""

from __future__ import annotations

import base64
import io
import math
import re
from pathlib import Path

import pytest

from d500 import leaderboard
from d500.leaderboard import summary
from d500.ledger import Ledger
from tests.helpers import tiny_mlp

ROOT = Path(__file__).resolve().parent.parent
OPS = ROOT / "tests" / "operators" / "ops"

CASE = """\
name: {name}
level: 0
operator: {op}
inputs: {inputs}
metrics: [{metrics}]
rank_by: {rank_by}
time_budget: 0.05
"""
# workload -> (its ranking metric, whether lower is better), as its file says
LEVEL0 = {"sig-a": ("latency", True), "sig-b": ("latency", True), "gemm-t": ("gflops", False)}
LEVEL1 = {"tiny-a": ("latency", True), "tiny-b": ("throughput", False),
          "tiny-c": ("latency", True)}


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> Ledger:
    """Level 0: a NumPy Sigmoid on two cases and a torch Gemm on one (ranked by GFLOP/s), each
    timed beside the reference and onnxruntime; level 1: two MLPs on both backends (one ranked
    by latency, one by throughput) and a third on onnxruntime alone (the reference misses it)."""
    from d500.networks import workloads
    from d500.networks.bench import bench
    from d500.operators.base import load
    from d500.operators.run import bench_cases
    from d500.operators.validate import Options
    from d500.operators.workloads import load_case

    folder = tmp_path_factory.mktemp("summary")
    mp = pytest.MonkeyPatch()
    mp.setenv("D500_HOME", str(folder / "home"))
    mp.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    cases = {}
    for name, op, inputs, metrics in (
            ("sig-a", "Sigmoid", "[[16, 64]]", "latency, forward_error, gradient_error"),
            ("sig-b", "Sigmoid", "[[64, 256]]", "latency, forward_error, gradient_error"),
            ("gemm-t", "Gemm", "[[32, 64], [64, 32]]",
             "latency, gflops, forward_error, gradient_error")):
        path = folder / f"{name}.yaml"
        path.write_text(CASE.format(name=name, op=op, inputs=inputs, metrics=metrics,
                                    rank_by=LEVEL0[name][0]))
        cases[name] = load_case(path)
    ledger = Ledger()
    both = ["reference", "onnxruntime"]
    sigmoid = load(f"{OPS / 'numpy_ops.py'}:Sigmoid")
    gemm = load(f"{OPS / 'torch_ops.py'}:Gemm")
    for loaded, names in ((sigmoid, ["sig-a", "sig-b"]), (gemm, ["gemm-t"])):
        for result in bench_cases(loaded, [cases[n] for n in names], both, Options(), 0.05,
                                  ledger=ledger):
            assert all(r.status == "ok" for r in result.rows), result.text()
    for name, backends in (("tiny-a", both), ("tiny-b", both), ("tiny-c", ["onnxruntime"])):
        path = folder / f"{name}.yaml"
        path.write_text(tiny_mlp(name, rank_by=LEVEL1[name][0]))
        assert bench(workloads.load(path), backends, ledger=ledger, budget=0.05).exit_code == 0
    yield ledger
    mp.undo()


def by_hand(ledger: Ledger, level: int, ranked: dict[str, tuple[str, bool]], key
            ) -> dict[str, dict[str, float]]:
    """times the best per entry per workload, straight from the recorded figures."""
    ratios: dict[str, dict[str, float]] = {}
    for workload, (metric, lower) in ranked.items():
        values = {}
        for run in ledger.runs(level=level, workload=workload, status="succeeded"):
            if metric in run["figures"]:
                values[key(run)] = run["figures"][metric]  # one timed run per entry
        best = min(values.values()) if lower else max(values.values())
        for name, value in values.items():
            ratios.setdefault(name, {})[workload] = value / best if lower else best / value
    return ratios


def expected_score(ratios: dict[str, float], n: int) -> float:
    """The normalised integral of rho over [1, 4]: each workload within 4x adds (4 - r) / 3."""
    return sum(max(0.0, 4.0 - r) / 3.0 for r in ratios.values()) / n


def check_rows(s: summary.Summary, ratios: dict[str, dict[str, float]], n: int) -> None:
    assert len(s.workloads) == n
    assert {r.key for r in s.rows} == set(ratios)
    at = {t: i for i, t in enumerate(s.profile.taus)}
    for row in s.rows:
        mine = ratios[row.key]
        assert row.ran == len(mine)
        assert row.score == pytest.approx(expected_score(mine, n), abs=1e-12), row.key
        assert row.geomean == pytest.approx(
            math.exp(sum(math.log(r) for r in mine.values()) / len(mine)), rel=1e-12)
        assert row.best_on == sum(r == 1.0 for r in mine.values())
        for tau in (1.0, 2.0, 4.0):
            assert s.profile.rho[row.key][at[tau]] == pytest.approx(
                sum(r <= tau for r in mine.values()) / n)
    scores = [r.score for r in s.rows]
    assert scores == sorted(scores, reverse=True)


def summary_view(ledger: Ledger, level: int):
    boards = leaderboard.build(ledger, level=level)
    [part] = leaderboard.parts(boards, ledger)
    return boards, part.views[0]


def test_level1_summary_per_backend_matches_the_recorded_figures(ledger):
    ratios = by_hand(ledger, 1, LEVEL1, lambda run: run["backend"])
    assert set(ratios["reference"]) == {"tiny-a", "tiny-b"}  # tiny-c: not run
    assert ratios["onnxruntime"]["tiny-c"] == 1.0
    boards, view = summary_view(ledger, 1)
    s = summary.summarise(boards, by_submission=False)
    check_rows(s, ratios, 3)
    ref = next(r for r in s.rows if r.backend == "reference")
    assert s.profile.rho["reference"][-1] <= 2 / 3  # the missing workload is never within tau
    assert view.title.startswith("Organiser's summary")
    assert view.headers == ["backend", "profile score", "best on", "geomean × best",
                            "workloads run", "ONNX conformance"]
    cells = {row[0]: row for row in view.rows}
    assert cells["reference"][1] == f"{ref.score:.3f}"
    assert cells["reference"][3] == f"{ref.geomean:.2f}×"
    assert cells["reference"][4] == "2 / 3"
    assert cells["reference"][5] == summary.NOT_RECORDED  # no conformance run in this ledger
    assert [row[0] for row in view.rows] == [r.key for r in s.rows]
    assert any("geometric mean of × best over the workloads the entry ran only" in n
               for n in view.notes)
    assert any("latency (lower is better) on 2, throughput (higher is better) on 1" in n
               for n in view.notes)


def test_level0_summary_per_submission_and_backend(ledger):
    ratios = by_hand(ledger, 0, LEVEL0, lambda run: f"{run['submission']} / {run['backend']}")
    assert set(ratios) == {"Sigmoid / numpy", "Gemm / torch", "builtin / reference",
                           "builtin / onnxruntime"}
    assert set(ratios["Gemm / torch"]) == {"gemm-t"}  # a Gemm enters only the Gemm case
    boards, view = summary_view(ledger, 0)
    s = summary.summarise(boards, by_submission=True, builtin="builtin")
    check_rows(s, ratios, 3)
    assert view.headers[:2] == ["submission", "backend"]
    cells = {(row[0], row[1]): row for row in view.rows}
    assert cells[("Gemm", "torch")][5] == "1 / 3"
    assert cells[("Sigmoid", "numpy")][-1] == "—"  # a custom operator is not a backend
    assert cells[("builtin", "onnxruntime")][-1] == summary.NOT_RECORDED


def test_the_summary_heads_its_level_in_markdown_terminal_and_html(ledger):
    from PIL import Image

    md = leaderboard.render(ledger, level=1, fmt="md")
    level1 = md[md.index("## level 1"):]
    assert level1.index("Organiser's summary") < level1.index("### level 1 · tiny-a")
    assert "| onnxruntime | " in level1
    text = leaderboard.render(ledger, level=0, fmt="terminal")
    assert "Organiser's summary" in text and "builtin" in text
    html = leaderboard.render(ledger, level=0, fmt="html")
    start = html.index("Organiser")  # its apostrophe is escaped in HTML
    uri = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html[start:]).group(1)
    with Image.open(io.BytesIO(base64.b64decode(uri, validate=True))) as img:
        img.load()
        assert img.format == "PNG" and img.size[0] <= 1000  # the step plot, not wider than 10 in


def test_each_workload_counts_with_its_newest_rules(tmp_path, monkeypatch):
    from d500.networks import workloads
    from d500.networks.bench import bench

    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny-v.yaml"
    path.write_text(tiny_mlp("tiny-v", rank_by="latency"))
    ledger = Ledger()
    assert bench(workloads.load(path), ["reference", "onnxruntime"], ledger=ledger,
                 budget=0.05).exit_code == 0
    path.write_text(tiny_mlp("tiny-v", rank_by="throughput"))  # new rules
    assert bench(workloads.load(path), ["onnxruntime"], ledger=ledger,
                 budget=0.05).exit_code == 0
    boards, view = summary_view(ledger, 1)
    assert len(boards) == 2
    s = summary.summarise(boards, by_submission=False)
    assert s.workloads == ["tiny-v"] and s.rank_by["tiny-v"].name == "throughput"
    [row] = s.rows  # the reference ran the older rules only
    assert (row.key, row.ran, row.score) == ("onnxruntime", 1, pytest.approx(1.0))
    assert s.older_versions == 1
    assert any("1 board of older rules versions left out" in n for n in view.notes)
