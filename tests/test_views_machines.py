"""The levels' views from ledgers holding two machines (this one's runs, and another CPU's imported
from relay records, as `mpiexec` ranks or a second host hand them over): level 2's tuning, seeds
and performance profile, level 3's scaling table and the organiser's summaries of levels 0/1 are
computed per machine, each headed by its hardware, with accuracies, byte counts and epochs pooled;
--across-machines pools them as before; every metric file says whether it is machine-dependent
and the boards honour it (a speed-up, a ratio of times, is ranked per machine)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from d500 import conformance_runs, leaderboard, metrics, provenance
from d500.leaderboard import environments, summary
from d500.leaderboard import text as board_text
from d500.ledger import Ledger
from d500.ledger.relay import Relay
from d500.levels import View
from d500.training.seeds import required

OTHER_CPU = "Test Vendor T-9654 96-Core Processor"  # no real CPU's name is part of it


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def import_other(ledger: Ledger, relay: Relay) -> None:
    """Import the relay's finished runs as measured on another machine (another CPU, 16 cores)."""
    while relay.finished:
        record = relay.take()
        record["provenance"]["cpu"].update(model=OTHER_CPU, logical_cores=16)
        ledger.import_run(record)


def here_cpu() -> str:
    return provenance.collect()["cpu"]["model"]


def one(views: list[View], *words: str) -> View:
    [found] = [v for v in views if all(w in v.title for w in words)]
    return found


def cells(view: View, *key: str) -> dict[str, str]:
    """The row whose first cells are `key`, by header."""
    [row] = [r for r in view.rows if tuple(r[:len(key)]) == key]
    return dict(zip(view.headers, row, strict=True))


# -- level 2 -------------------------------------------------------------------------------------

LEVEL2 = """\
name: {name}
level: 2
metrics: [time_to_accuracy, test_accuracy, epochs]
rank_by: time_to_accuracy
"""


def seed(ledger: Ledger | Relay, path: Path, sub: str, tta: float, acc: float, epochs: float,
         seed: int, curve: bool = False) -> None:
    run = ledger.start_run(level=2, workload=path.stem, submission=sub, backend="torch",
                           seed=required(2, path.stem, sub, "torch", 3)[seed],
                           workload_file=path)  # the rules' seed `seed` (of the default 3)
    if curve:
        run.evaluation(epoch=1, metrics={"val_accuracy": 0.5}, wall_time=tta / 2)
        run.evaluation(epoch=2, metrics={"val_accuracy": 0.97}, wall_time=tta)
    run.finish("succeeded", figures={"time_to_accuracy": tta, "test_accuracy": acc,
                                     "epochs": epochs}, details={"target": 0.97})


def trial(ledger: Ledger | Relay, study: int, path: Path, n: int, tta: float | None,
          acc: float) -> None:
    run = ledger.start_run(level=2, workload=path.stem, submission="A", backend="torch",
                           workload_file=path, study=study, trial=n,
                           hyperparameters={"lr": 0.1 * (n + 1)})
    figures = {"test_accuracy": acc, "epochs": 5.0}
    if tta is not None:
        figures["time_to_accuracy"] = tta
    run.finish("succeeded", figures=figures)


@pytest.fixture
def level2(home, tmp_path) -> Ledger:
    """Two workloads, entries A and B on torch. Here: A's seeds at 4/6/8 s and 10 s, B's at 12 s
    and 20 s, a study of A on w1 (5 s, and a trial that missed). There: A at 3 s and 9 s, B at
    1/2 s and 3 s, a study of A on w1 (2 s). Pooled, the machines' times would mix."""
    w1 = write(tmp_path / "w1.yaml", LEVEL2.format(name="w1"))
    w2 = write(tmp_path / "w2.yaml", LEVEL2.format(name="w2"))
    ledger = Ledger(home / "ledger.sqlite")
    for i, (tta, acc, epochs) in enumerate(((4.0, 0.90, 5), (6.0, 0.92, 6), (8.0, 0.94, 7))):
        seed(ledger, w1, "A", tta, acc, epochs, i, curve=i == 0)
    seed(ledger, w2, "A", 10.0, 0.90, 5, 0)
    seed(ledger, w1, "B", 12.0, 0.80, 9, 0)
    seed(ledger, w2, "B", 20.0, 0.80, 9, 0)
    study = ledger.start_study("A-here", 2, "w1", "A", "torch", "time_to_accuracy")
    trial(ledger, study.id, w1, 0, 5.0, 0.91)
    trial(ledger, study.id, w1, 1, None, 0.50)
    study.finish()
    relay = Relay()
    seed(relay, w1, "A", 3.0, 0.96, 4, 0, curve=True)
    seed(relay, w2, "A", 9.0, 0.90, 5, 0)
    seed(relay, w1, "B", 1.0, 0.80, 9, 0)
    seed(relay, w1, "B", 2.0, 0.80, 9, 1)
    seed(relay, w2, "B", 3.0, 0.80, 9, 0)
    there = ledger.start_study("A-there", 2, "w1", "A", "torch", "time_to_accuracy")
    trial(relay, there.id, w1, 0, 2.0, 0.97)
    import_other(ledger, relay)
    there.finish()
    return ledger


def test_level2_times_per_machine_accuracies_pooled(level2):
    boards = leaderboard.build(level2, level=2)
    assert all(len(b.machines) == 2 for b in boards)
    [part] = leaderboard.parts(boards, level2)
    views, here = part.views, here_cpu()
    titles = [v.title for v in views]
    tuning = [t for t in titles if t.startswith("tuning on ")]
    assert len(tuning) == 2 and here in tuning[0] and OTHER_CPU in tuning[1]  # ledger order

    # seeds: each machine's own times (pooled, A on w1 would be the median of 3, 4, 6, 8 s)
    seeds_here, seeds_there = one(views, "seeds on", here), one(views, "seeds on", OTHER_CPU)
    assert "test" not in seeds_here.headers
    assert cells(seeds_here, "w1", "A", "torch")["median"] == "6 s"
    assert cells(seeds_here, "w1", "A", "torch")["seeds"] == "3"
    assert cells(seeds_there, "w1", "A", "torch")["median"] == "3 s"
    assert cells(seeds_there, "w1", "B", "torch")["median"] == "1.5 s"
    assert cells(seeds_here, "w1", "B", "torch")["median"] == "12 s"
    assert any("rows of this machine only" in n for n in seeds_here.notes)

    # tuning: each machine's studies alone (pooled, the median over both would be 3.5 s)
    tune_here, tune_there = one(views, "tuning on", here), one(views, "tuning on", OTHER_CPU)
    assert cells(tune_here, "w1", "A", "torch")["score"] == "5 s"
    assert cells(tune_there, "w1", "A", "torch")["score"] == "2 s"
    assert cells(tune_here, "w1", "A", "torch")["studies"] == "1"
    trials = {m: [r for r in level2.runs(level=2) if r["study"] is not None
                  and (OTHER_CPU in str(level2.environments()[r["environment"]])) == m]
              for m in (False, True)}
    cost = sum(r["stopped_unix"] - r["started_unix"] for r in trials[True])
    assert cells(tune_there, "w1", "A", "torch")["tuning cost"] == \
        metrics.get("time_to_accuracy").format(cost)

    # the profile per machine: here A is fastest everywhere; there B is
    prof_here = one(views, "performance profile", here)
    prof_there = one(views, "performance profile", OTHER_CPU)
    score_here = {r[0]: float(r[1]) for r in prof_here.rows}
    score_there = {r[0]: float(r[1]) for r in prof_there.rows}
    # here: A 5 s (study) and 10 s; B 12 s (x2.4) and 20 s (x2): B = ((4-2.4) + (4-2)) / 3 / 2
    assert score_here == {"A / torch": 1.0, "B / torch": pytest.approx(0.6, abs=1e-3)}
    # there: A 2 s (study, x4/3 of B's 1.5 s) and 9 s (x3 of 3 s)
    assert score_there == {"B / torch": 1.0,
                           "A / torch": pytest.approx((8 / 3 + 1) / 6, abs=1e-3)}
    assert len(prof_here.plots) == 1 and len(prof_there.plots) == 1

    # what compares anywhere: pooled over both machines' runs
    acc = one(views, "accuracy over every machine")
    row = cells(acc, "w1", "A", "torch")
    assert row["seeds"] == "4" and row["test"] == "0.9300"  # 0.90 .92 .94 here, .96 there
    assert row["epochs to target"] == "5.5"  # 5 6 7 here, 4 there
    assert row["test at target"] == "0.9400"  # fastest trials: 0.91 here, 0.97 there
    assert row["studies"] == "2"

    # wall-time curves: one plot per machine
    curves = one(views, "w1: validation accuracy against wall time")
    assert [c for c, _ in curves.plots] == [f"w1: tuning curves on {h}" for h in
                                            environments.apart(boards).values()]
    assert "one plot per machine" in curves.title

    md = leaderboard.markdown(boards, level2)
    for words in environments.apart(boards).values():
        assert f"### seeds on {words}: time to accuracy" in md
        assert f"### performance profile over 2 workload(s) on {words}:" in md


def test_level2_across_machines_pools_as_before(level2):
    boards = leaderboard.build(level2, level=2, across_machines=True)
    [part] = leaderboard.parts(boards, level2)
    titles = [v.title for v in part.views]
    assert environments.apart(boards) == {}
    assert titles[0].startswith("tuning: score") and titles[1].startswith("seeds: time")
    assert not any(" on " in t.split(":")[0] for t in titles)
    seeds = part.views[1]
    assert cells(seeds, "w1", "A", "torch")["median"] == "5 s"  # 3 4 6 8: both machines
    assert cells(seeds, "w1", "A", "torch")["test"] == "0.9300"


# -- level 3 -------------------------------------------------------------------------------------

LEVEL3 = """\
name: dist
level: 3
distributed: {ranks: [1, 2], reference_ranks: 1}
metrics: [time_to_accuracy, test_accuracy, bytes_per_step, comm_share, scaling_efficiency,
          speedup, epochs]
rank_by: time_to_accuracy
"""


def dist(ledger: Ledger | Relay, path: Path, scheme: str, ranks: int, tta: float, acc: float,
         share: float) -> None:
    run = ledger.start_run(level=3, workload="dist", submission=scheme, backend="torch",
                           seed=required(3, "dist", scheme, "torch", 1, ranks)[0],
                           workload_file=path, hyperparameters={"scheme": scheme}, rank=0,
                           world_size=ranks)
    run.finish("succeeded", figures={"time_to_accuracy": tta, "test_accuracy": acc,
                                     "epochs": 6.0, "bytes_per_step": 1000.0 * (ranks - 1),
                                     "comm_share": share})


def test_level3_scaling_and_baseline_per_machine(home, tmp_path):
    """Here sync takes 10 s at 1 rank and 6 s at 2 (DDP 5 s); there 4 s and 3 s (DDP 2 s): the
    efficiency, speed-up and vs-DDP of each machine come from its own runs."""
    path = write(tmp_path / "dist.yaml", LEVEL3)
    ledger = Ledger(home / "ledger.sqlite")
    for scheme, ranks, tta, acc, share in (("sync", 1, 10.0, 0.95, 0.0),
                                           ("sync", 2, 6.0, 0.95, 0.3),
                                           ("ddp", 2, 5.0, 0.94, 0.2)):
        dist(ledger, path, scheme, ranks, tta, acc, share)
    relay = Relay()
    for scheme, ranks, tta, acc, share in (("sync", 1, 4.0, 0.97, 0.0), ("sync", 2, 3.0, 0.97, 0.5),
                                           ("ddp", 2, 2.0, 0.96, 0.4)):
        dist(relay, path, scheme, ranks, tta, acc, share)
    import_other(ledger, relay)

    boards = leaderboard.build(ledger, level=3)
    assert [b.world_size for b in boards] == [1, 2] and all(b.per_machine for b in boards)
    [part] = leaderboard.parts(boards, ledger)
    here = here_cpu()
    table_here = one(part.views, "distributed on", here, "every entry")
    table_there = one(part.views, "distributed on", OTHER_CPU, "every entry")
    assert "test" not in table_here.headers and "bytes/step" not in table_here.headers
    mine = cells(table_here, "dist", "2", "sync")
    assert (mine["time to accuracy"], mine["scaling eff"], mine["speed-up"], mine["vs DDP"]) == (
        "6 s", "0.833", "1.67 x", "1.20")
    assert mine["comm share"] == "0.300"
    theirs = cells(table_there, "dist", "2", "sync")
    assert (theirs["time to accuracy"], theirs["scaling eff"], theirs["speed-up"],
            theirs["vs DDP"]) == ("3 s", "0.667", "1.33 x", "1.50")
    assert cells(table_there, "dist", "1", "sync")["scaling eff"] == "1.000"
    assert any("the reference and DDP runs are this machine's too" in n
               for n in table_here.notes)
    plots = [v for v in part.views if "against ranks" in v.title]
    assert len(plots) == 2 and OTHER_CPU in plots[1].plots[0][0]

    pooled = one(part.views, "distributed over every machine")
    row = cells(pooled, "dist", "2", "sync")
    assert (row["test"], row["bytes/step"], row["epochs"], row["ok/runs"]) == (
        "0.9600", "1000 B", "6", "2/2")

    across = leaderboard.build(ledger, level=3, across_machines=True)
    [part] = leaderboard.parts(across, ledger)
    table = one(part.views, "distributed: every entry")  # pooled: medians of both machines
    row = cells(table, "dist", "2", "sync")
    assert (row["time to accuracy"], row["scaling eff"], row["test"]) == (
        "4.5 s", f"{7 / 9:.3f}", "0.9600")


# -- the organiser's summary (levels 0 and 1) ----------------------------------------------------

def bench(ledger: Ledger | Relay, path: Path, level: int, sub: str, backend: str,
          figures: dict[str, float]) -> None:
    seed = required(level, path.stem, sub, backend, 1)[0] if level in (2, 3) else None
    ledger.start_run(level=level, workload=path.stem, submission=sub, backend=backend,
                     seed=seed, workload_file=path).finish("succeeded", figures=figures)


@pytest.fixture
def level1(home, tmp_path) -> Ledger:
    """net-a ranked by latency (here: reference 2 ms, onnxruntime 1 ms; there: reference 0.5 ms);
    net-b by agreement, comparable anywhere (onnxruntime 1e-7 and reference 2e-7 here, reference
    4e-7 there)."""
    a = write(tmp_path / "net-a.yaml", "name: net-a\nlevel: 1\nmetrics: [latency, agreement]\n"
                                       "rank_by: latency\n")
    b = write(tmp_path / "net-b.yaml", "name: net-b\nlevel: 1\nmetrics: [agreement, latency]\n"
                                       "rank_by: agreement\n")
    ledger = Ledger(home / "ledger.sqlite")
    for backend, latency, agreement in (("reference", 2e-3, 2e-7), ("onnxruntime", 1e-3, 1e-7)):
        bench(ledger, a, 1, backend, backend, {"latency": latency, "agreement": 0.0})
        bench(ledger, b, 1, backend, backend, {"agreement": agreement, "latency": latency})
    relay = Relay()
    bench(relay, a, 1, "reference", "reference", {"latency": 5e-4, "agreement": 0.0})
    bench(relay, b, 1, "reference", "reference", {"agreement": 4e-7, "latency": 5e-4})
    import_other(ledger, relay)
    return ledger


def test_level1_summary_one_per_machine_never_merging_a_backend(level1):
    boards = leaderboard.build(level1, level=1)
    machines = summary.per_machine(boards)
    here_key, there_key = machines
    assert OTHER_CPU in machines[there_key] and here_cpu() in machines[here_key]
    here = summary.summarise(boards, by_submission=False, machine=here_key)
    there = summary.summarise(boards, by_submission=False, machine=there_key)
    assert here.profile.ratios == {"reference": {"net-a": 2.0, "net-b": 2.0},
                                   "onnxruntime": {"net-a": 1.0, "net-b": 1.0}}
    # there: latency against its own best (itself); agreement against every machine's best
    assert there.profile.ratios == {"reference": {"net-a": 1.0, "net-b": 4.0}}
    assert [r.key for r in here.rows] == ["onnxruntime", "reference"]
    assert here.rows[1].score == pytest.approx(2 * (4 - 2) / 3 / 2)
    assert there.rows[0].score == pytest.approx((4 - 1) / 3 / 2)  # 4x on net-b: never within

    views = summary.views(boards, level1, by_submission=False)
    assert len(views) == 2
    assert views[0].title.startswith(f"Organiser's summary on {machines[here_key]}: ")
    assert views[1].title.startswith(f"Organiser's summary on {machines[there_key]}: ")
    assert [r[0] for r in views[1].rows] == ["reference"] and views[1].rows[0][2] == "1 / 2"
    assert any("rows of this machine only" in n for n in views[0].notes)
    [part] = leaderboard.parts(boards, level1)
    assert [v.title for v in part.views] == [v.title for v in views]

    # --across-machines: one summary, the backend's best ratio over its machines (as before)
    across = leaderboard.build(level1, level=1, across_machines=True)
    pooled = summary.summarise(across, by_submission=False)
    assert summary.per_machine(across) == {} and pooled.on == ""
    assert pooled.profile.ratios["reference"] == {"net-a": 1.0, "net-b": 2.0}
    [view] = summary.views(across, level1, by_submission=False)
    assert view.title.startswith("Organiser's summary: ")


def test_a_summary_of_comparable_figures_stays_pooled(level1):
    boards = leaderboard.build(level1, level=1, workload="net-b")  # ranked by agreement only
    assert len(boards[0].machines) == 2 and not boards[0].per_machine
    assert summary.per_machine(boards) == {}
    [view] = summary.views(boards, level1, by_submission=False)
    assert view.title.startswith("Organiser's summary: ")
    assert {r[0]: r[3] for r in view.rows} == {"onnxruntime": "1.00×", "reference": "2.00×"}


def conformance(ledger: Ledger | Relay, backend: str, passed: int, total: int = 1872) -> None:
    """A complete `d500 conformance` run as conformance_runs.record seals it (the suite itself
    takes 20-30 s to build: test_conformance_runs.py runs it)."""
    import onnx
    versions = {"onnx_version": onnx.__version__, "opset": 28}
    with ledger.start_run(level=conformance_runs.LEVEL, workload=conformance_runs.WORKLOAD,
                          submission=conformance_runs.SUBMISSION, backend=backend,
                          hyperparameters={"ops": None, "device": "CPU", **versions}) as run:
        run.record(figures={"node_tests_passed": passed, "node_tests_failed": total - passed,
                            "node_tests_unsupported": 0, "node_tests_total": total},
                   details={"partial": False, "ops": None, **versions, "device": "CPU"})


def test_each_machines_summary_shows_its_own_conformance_counts(level1):
    """Reference conformance recorded here (1870) and, later, there (1800); onnxruntime's only
    there, where it has no benchmark row: each machine's summary shows its own machine's count,
    onnxruntime's row here shows none, and the counts not shown are listed with their hardware.
    Pooled (comparable figures, or --across-machines) a row shows each of its machines' counts."""
    conformance(level1, "reference", 1870)
    relay = Relay()
    conformance(relay, "reference", 1800)
    conformance(relay, "onnxruntime", 1438)
    import_other(level1, relay)
    boards = leaderboard.build(level1, level=1)
    machines = summary.per_machine(boards)
    here_key, there_key = machines
    counts, hardware = summary.conformance(level1)
    assert {k: c.passed for k, c in counts.items()} == {
        ("reference", here_key): 1870, ("reference", there_key): 1800,
        ("onnxruntime", there_key): 1438}
    assert hardware[there_key] == machines[there_key]
    mine, theirs = counts["reference", here_key], counts["reference", there_key]
    ort = counts["onnxruntime", there_key]

    here_view, there_view = summary.views(boards, level1, by_submission=False)
    assert {r[0]: r[-1] for r in here_view.rows} == {
        "onnxruntime": summary.NOT_RECORDED, "reference": f"1870 / 1872 ({mine.date})"}
    assert {r[0]: r[-1] for r in there_view.rows} == {"reference": f"1800 / 1872 ({theirs.date})"}
    conf = next(n for n in here_view.notes if n.startswith("ONNX conformance"))
    assert f"ledger run {mine.run_id})" in conf and "on the machine of the row's runs" in conf
    [others] = [n for n in here_view.notes if n.startswith("conformance recorded on other")]
    assert others.endswith(f"onnxruntime 1438 / 1872 ({ort.date}) on {machines[there_key]}; "
                           f"reference 1800 / 1872 ({theirs.date}) on {machines[there_key]}")
    [others] = [n for n in there_view.notes if n.startswith("conformance recorded on other")]
    assert f"reference 1870 / 1872 ({mine.date}) on {machines[here_key]}" in others

    # one summary over both machines: the pooled row shows each machine's count, in order
    for pooled in (leaderboard.build(level1, level=1, workload="net-b"),
                   leaderboard.build(level1, level=1, across_machines=True)):
        [view] = summary.views(pooled, level1, by_submission=False)
        assert {r[0]: r[-1] for r in view.rows} == {
            "onnxruntime": summary.NOT_RECORDED,
            "reference": f"1870 / 1872 ({mine.date}); 1800 / 1872 ({theirs.date})"}
        conf = next(n for n in view.notes if n.startswith("ONNX conformance"))
        assert f"ledger runs {mine.run_id}, {theirs.run_id})" in conf
        assert "A row pooling several machines shows each one's count" in conf
        [others] = [n for n in view.notes if n.startswith("conformance recorded on other")]
        assert others.endswith(f"onnxruntime 1438 / 1872 ({ort.date}) on {machines[there_key]}")


def test_level0_summary_per_machine_by_submission(home, tmp_path):
    gemm = write(tmp_path / "gemm.yaml", "name: gemm\nlevel: 0\nmetrics: [latency, "
                                         "forward_error]\nrank_by: latency\n")
    ledger = Ledger(home / "ledger.sqlite")
    for sub, latency in (("fast", 1e-3), ("slow", 3e-3)):
        bench(ledger, gemm, 0, sub, "numpy", {"latency": latency, "forward_error": 1e-7})
    relay = Relay()
    bench(relay, gemm, 0, "slow", "numpy", {"latency": 5e-4, "forward_error": 2e-7})
    import_other(ledger, relay)
    boards = leaderboard.build(ledger, level=0)
    [part] = leaderboard.parts(boards, ledger)
    here_view, there_view = part.views
    assert here_cpu() in here_view.title and OTHER_CPU in there_view.title
    assert {(r[0], r[1]): r[4] for r in here_view.rows} == {("fast", "numpy"): "1.00×",
                                                            ("slow", "numpy"): "3.00×"}
    # the same submission on the other machine: its own row, its own machine's best
    assert {(r[0], r[1]): r[4] for r in there_view.rows} == {("slow", "numpy"): "1.00×"}


# -- the machine-dependent flag on the boards (each metric's own flag: tests/test_metrics.py) --

def test_boards_rank_by_the_flag_not_the_unit(home, tmp_path, monkeypatch):
    """A speed-up (unit x, a ratio of times) is ranked per machine; a simulated time (unit s,
    flagged machine-independent) across machines."""
    monkeypatch.setenv("D500_METRICS", str(tmp_path / "metrics"))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "sim_time.py").write_text(
        'NAME = "sim_time"\nUNIT = "s"\nDIRECTION = "lower"\nMACHINE_DEPENDENT = False\n'
        'MEASURED = "simulated seconds of a cycle-accurate model"\n')
    sp = write(tmp_path / "sp.yaml", "name: sp\nlevel: 3\nmetrics: [speedup, test_accuracy]\n"
                                     "rank_by: speedup\n")
    sim = write(tmp_path / "sim.yaml", "name: sim\nlevel: 0\nmetrics: [sim_time]\n")
    ledger = Ledger(home / "ledger.sqlite")
    bench(ledger, sp, 3, "a", "torch", {"speedup": 1.5, "test_accuracy": 0.9})
    bench(ledger, sp, 3, "b", "torch", {"speedup": 1.2, "test_accuracy": 0.9})
    bench(ledger, sim, 0, "a", "numpy", {"sim_time": 2.0})
    relay = Relay()
    bench(relay, sp, 3, "c", "torch", {"speedup": 3.0, "test_accuracy": 0.9})
    bench(relay, sim, 0, "c", "numpy", {"sim_time": 1.0})
    import_other(ledger, relay)

    [speedup] = leaderboard.build(ledger, workload="sp")
    assert speedup.per_machine
    assert {e.submission: (e.rank, e.ratio) for e in speedup.entries} == {
        "a": (1, 1.0), "b": (2, 1.25), "c": (1, 1.0)}
    notes = board_text.machine_notes(speedup)
    assert any("each machine's rows are ranked apart" in n for n in notes)
    assert any(n.endswith(": speedup; comparable across machines: test_accuracy") for n in notes)

    [simulated] = leaderboard.build(ledger, workload="sim")
    assert not simulated.per_machine
    assert [(e.submission, e.rank, e.ratio) for e in simulated.entries] == [
        ("c", 1, 1.0), ("a", 2, 2.0)]
    assert summary.per_machine([simulated]) == {}
    assert math.isclose(summary.summarise([simulated], True).rows[1].geomean, 2.0)


def test_level3_reference_time_is_taken_on_the_runs_own_machine(home, tmp_path):
    """The stored speedup/scaling_efficiency of a level-3 run divide by a reference time from
    runs of the same hardware only: another machine's faster 1-rank runs are no reference."""
    from d500.distributed.figures import reference_time
    from d500.leaderboard.environments import machine

    path = write(tmp_path / "w3.yaml", LEVEL2.replace("level: 2", "level: 3").format(name="w3"))
    ledger, relay = Ledger(), Relay()

    def one_rank(book, tta):
        run = book.start_run(level=3, workload="w3", submission="S", backend="torch",
                             workload_file=path, world_size=1)
        run.finish("succeeded", figures={"time_to_accuracy": tta})

    one_rank(ledger, 10.0)
    one_rank(ledger, 12.0)
    one_rank(relay, 1.0)
    import_other(ledger, relay)
    envs = ledger.environments()
    here = machine(envs[ledger.runs()[0]["environment"]])
    there = machine(envs[ledger.runs()[-1]["environment"]])
    assert here != there
    args = (ledger, 3, "w3", "S", "torch", 1)
    assert reference_time(*args) == 10.0  # every machine pooled: the median of 1, 10, 12
    assert reference_time(*args, machine_key=here) == 11.0
    assert reference_time(*args, machine_key=there) == 1.0
