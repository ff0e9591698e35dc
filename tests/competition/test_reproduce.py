"""d500 reproduce on the real digits package of the shared fixtures: two drawn runs re-run through
the real trainer agree with the package and are recorded as sealed reproductions; a figure
altered with every hash re-made (so `d500 check` passes) is caught by reproduction alone, naming
the run and the figure; a submission changed after its runs is not reproducible; too many runs
and a workload that is not the rulebook's are refused (exit 2) before anything runs. A real
level-3 run is reproduced under mpiexec at its world size and real level-0 validations are
validated again. The comparison rules themselves are tested on hand-made evaluation series."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from d500.competition import reproduce as rp
from d500.competition.check import check_package
from d500.competition.layout import SUBMISSION_FILES
from d500.competition.package import Package
from d500.competition.reproduce_compare import Series, compare, show
from d500.competition.reproduce_time import RATIO, SLACK_S, judged, slowdown, too_fast
from d500.distributed.launcher import launch_train, mpiexec
from d500.ledger import Ledger
from d500.ledger.store import dumps
from d500.paths import examples, rulebook

from .packages import draw_seed, repack, reseal

RULEBOOK, EXAMPLES = rulebook(), examples()


def _seed_runs(path: Path) -> list[int]:
    return [r.origin_id for r in Package.open(path).runs() if r.trial is None]


def test_two_drawn_runs_reproduce_and_agree(digits_package, rules_dir, tmp_path, run_d500,
                                            monkeypatch):
    """Honest runs reproduced on their own machine, beside a process spinning on one of its
    cores, agree in everything that does not depend on the machine, bit for bit. Their times
    agree where the load the reproduction saw is judged, are inconclusive where not
    (d500.competition.reproduce_time), and never disagree: the slowdown the rule reads from the
    load slows the whole quiet tolerance, its slack too. (The rule before added the 0.05 s
    unslowed and accused a 0.063 s run here, reproduced 3.86x at a load read as 2.00x, by 4 ms;
    benchmarks/reproduce_load.py measured honest short runs needing at most half that slack.)"""
    import subprocess
    import sys

    from d500.provenance import LOADED_SHARE
    monkeypatch.setenv("D500_LOADED_SHARE", str(LOADED_SHARE))
    seed_runs = _seed_runs(digits_package)
    seed = draw_seed(digits_package, 2, {seed_runs[0]})  # a succeeded run, and one more
    ledger = tmp_path / "organiser" / "ledger.sqlite"
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the neighbour
    try:
        result = run_d500(None, "reproduce", str(digits_package), "--runs", "2", "--seed",
                          str(seed), "--rules", str(rules_dir), "--ledger", str(ledger))
    finally:
        spin.kill()
        spin.wait()
    out = result.stdout
    assert f"2 of 6 re-runnable run(s) chosen with seed {seed} (given" in out
    assert "a draw of 2 of 6 holds at least one forged run with probability 33% if 1 is, 60% if " \
           "2 are, 80% if 3 are forged (1 - C(N-F,K)/C(N,K)); 95% needs --runs 6 for 1, " \
           "--runs 5 for 2, --runs 3 for 3" in out
    assert out.count("times compared: this machine's hardware is the run's (key ") == 2, out
    pkg = Package.open(digits_package)
    origin = {r.origin_id: r for r in pkg.runs()}
    unjudged = set()  # origin runs whose times the rule cannot judge at the load it saw
    for run in Ledger(ledger).runs():
        o = origin[run["details"]["reproduction"]["origin_run"]]
        if not judged(_allowed(ledger, run["id"])) and o.evaluations:  # a failed run: no times
            unjudged.add(o.origin_id)
    lines = [line for line in out.splitlines() if line.startswith(("disagrees:", "inconclusive:"))]
    assert not [line for line in lines if line.startswith("disagrees")], out  # never accused
    assert "DISAGREES" not in out, out  # nor the drawn runs' times together
    assert all(re.match(r"inconclusive: run \d+: (time_to_accuracy|evaluation times): ", line)
               for line in lines), out  # times only, never a figure
    assert {int(re.match(r"inconclusive: run (\d+):", line)[1]) for line in lines} == unjudged
    assert out.count("times not judged: this machine was too loaded") >= len(unjudged), out
    if not unjudged:
        assert "2 of 2 run(s) agree with the package" in out, out
    else:  # only inconclusive ones beside the agreeing: said so, not "0 of 2 run(s) agree"
        assert f"{len(unjudged)} of 2 run(s) inconclusive (run " in out, out
    assert result.returncode == (1 if unjudged else 0), out + result.stderr
    book = Ledger(ledger)
    runs = book.runs()
    assert len(runs) == 2
    for run in runs:  # sealed, no local parent, marked with the package and the origin run
        mark = run["details"]["reproduction"]
        assert mark["package"] == pkg.sha256 and run["parent"] is None
        o = origin[mark["origin_run"]]
        assert (run["seed"], run["backend"], run["workload"], run["submission"]) == (
            o.seed, o.backend, o.workload, o.submission)
        assert run["status"] == o.status
        if o.status == "succeeded":  # the same machine: the same figures to the last bit
            for name in ("epochs", "steps", "val_accuracy", "test_accuracy"):
                assert run["figures"][name] == o.figures[name], name
            evals = [json.loads(e[3]) for e in o.evaluations]
            assert [e["metrics"] for e in book.evaluations(run["id"])] == evals
    assert {r["details"]["reproduction"]["origin_run"] for r in runs} >= {seed_runs[0]}
    assert book.verify() == []  # the reproductions' files (kept under the ledger) verify
    # the same draw again: the same runs
    again = rp.choose(rp.drawable(pkg.runs())[0], 2, seed)
    assert {r.origin_id for r in again} == {r["details"]["reproduction"]["origin_run"]
                                            for r in runs}


def test_an_altered_figure_is_caught_only_by_reproduction(digits_package, rules_dir, tmp_path,
                                                          run_d500):
    target = _seed_runs(digits_package)[0]
    claimed = {}

    def better(figures: dict) -> None:
        for name in ("test_accuracy", "final_test_accuracy"):
            figures[name] = claimed[name] = min(1.0, figures[name] + 6 / 300)

    def log_too(found: dict[str, bytes]) -> None:
        """The figures' MLLOG lines and the last evaluation's test accuracy forged alike (and
        the log's hash in the seal), so that d500 check's consistency step cannot tell."""
        name, log = f"d500-package/runs/{target}.json", f"d500-package/runs/{target}.mllog.txt"
        rec = json.loads(found[name])
        metrics = json.loads(rec["evaluations"][-1][3])
        metrics["test_accuracy"] = min(1.0, metrics["test_accuracy"] + 6 / 300)
        rec["evaluations"][-1][3] = dumps(metrics)
        found[log] = re.sub(rb'("key": "(final_)?test_accuracy", "value": )[0-9.]+',
                            b"\\g<1>" + repr(metrics["test_accuracy"]).encode(), found[log])
        for art in rec["artifacts"]:
            if art[0] == rec["row"]["mllog"]:
                art[1:] = [hashlib.sha256(found[log]).hexdigest(), len(found[log])]
        found[name] = json.dumps(rec).encode()
        reseal(target, better)(found)

    altered = repack(digits_package, tmp_path / "altered.tar.gz", log_too)
    pkg = Package.open(altered)
    assert pkg.member_problems() == [] and pkg.chain_problems() == []
    assert check_package(pkg, rules_dir) == []  # the checker cannot tell
    seed = draw_seed(altered, 1, {target})
    result = run_d500(None, "reproduce", str(altered), "--runs", "1", "--seed", str(seed),
                      "--rules", str(rules_dir), "--ledger", str(tmp_path / "l.sqlite"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("disagrees:")]
    assert any(line.startswith(f"disagrees: run {target}: test_accuracy: recorded "
                               f"{show(claimed['test_accuracy'])}") for line in lines), lines
    assert any(f"run {target}: final_test_accuracy" in line for line in lines), lines
    assert not any("epochs" in line or "status" in line for line in lines), lines
    assert "0 of 1 run(s) agree" in result.stdout


def _halved(target: int) -> Callable[[dict[str, bytes]], None]:
    """The attack of issue 17: run `target`'s time halved consistently, in its figures (the
    time split too, throughput doubled), its evaluations' wall and recorded times, its stop time
    and its MLLOG (every timestamp from run_start on, and the figure lines), everything
    re-sealed."""
    fields = ("time_to_accuracy", "train_time", "data_time", "eval_time")

    def edit(found: dict[str, bytes]) -> None:
        name, log = f"d500-package/runs/{target}.json", f"d500-package/runs/{target}.mllog.txt"
        records = [json.loads(line.split(":::MLLOG ", 1)[1])
                   for line in found[log].decode().splitlines()]
        start = next(r["time_ms"] for r in records if r["key"] == "run_start")
        lines = []
        for r in records:
            if r["time_ms"] >= start:
                r["time_ms"] = start + (r["time_ms"] - start) // 2
            if r["key"] in fields and "unit" in r["metadata"]:
                r["value"] = r["value"] / 2
            if r["key"] == "samples_per_second":
                r["value"] = r["value"] * 2
            lines.append(":::MLLOG " + json.dumps(r))
        found[log] = ("\n".join(lines) + "\n").encode()
        rec = json.loads(found[name])
        for e in rec["evaluations"]:
            e[2] = e[2] / 2
            e[4] = (start + (e[4] * 1e3 - start) / 2) / 1e3
        rec["row"]["stopped"] = (start + (rec["row"]["stopped"] * 1e3 - start) / 2) / 1e3
        for art in rec["artifacts"]:
            if art[0] == rec["row"]["mllog"]:
                art[1:] = [hashlib.sha256(found[log]).hexdigest(), len(found[log])]
        found[name] = json.dumps(rec).encode()

        def figures(f: dict) -> None:
            for key in fields:
                f[key] = f[key] / 2
            f["samples_per_second"] *= 2
        reseal(target, figures)(found)
    return edit


def _allowed(ledger: Path, run_id: int) -> float:
    """The slowdown the time rule judged a reproduction's times at (not `judged`: too loaded to
    judge): its LoadWatch record, at the cores it wants (its threads x ranks)."""
    row = Ledger(ledger).get(run_id)
    threads = ((row.get("provenance") or {}).get("threads") or {}).get("count")
    demand = None if threads is None else threads * (row.get("world_size") or 1)
    return slowdown(row["details"].get("load_average"), demand)


def _quiet(watched: dict | None) -> bool:
    """Whether a LoadWatch record says other processes took at most d500's default share of the
    cores (not the share this suite sets for its boards)."""
    from d500.provenance import LOADED_SHARE
    watched = watched or {}
    during, cores = watched.get("during"), watched.get("usable_cores")
    return isinstance(during, (int, float)) and isinstance(cores, (int, float)) and \
        during <= LOADED_SHARE * cores


def test_a_time_halved_and_resealed_is_caught_on_the_same_hardware(digits_package, rules_dir,
                                                                   tmp_path, run_d500):
    """Time to accuracy halved in the figures, the evaluations and the MLLOG alike, re-sealed:
    reproduced on the run's own hardware, its times disagree on a machine its LoadWatch does
    not mark loaded, where the run is long enough for the tolerance to resolve 2x (a digits run
    of 0.23 s halved to 0.11 s reproduced in 0.22 s: within 1.5x + 0.05 s, not caught). On a
    loaded one (this suite's shared machine ran the fixture's run in 9 to
    19 s) the tolerance widens by the load, which can hide the 2x: the checks then follow it,
    and everything but the times still agrees."""
    target, other = _seed_runs(digits_package)[:2]
    forged = repack(digits_package, tmp_path / "halved1.tar.gz", _halved(other))
    forged = repack(forged, tmp_path / "halved.tar.gz", _halved(target))
    pkg = Package.open(forged)
    assert pkg.member_problems() == [] and pkg.chain_problems() == []
    run = next(r for r in pkg.runs() if r.origin_id == target)
    true = next(r for r in Package.open(digits_package).runs() if r.origin_id == target)
    assert run.figures["time_to_accuracy"] == true.figures["time_to_accuracy"] / 2
    seed = draw_seed(forged, 2, {target, other})
    result = run_d500(None, "reproduce", str(forged), "--runs", "2", "--seed", str(seed),
                      "--rules", str(rules_dir), "--ledger", str(tmp_path / "l.sqlite"),
                      "--json")
    found = json.loads(result.stdout)
    report, second = sorted(found["runs"], key=lambda r: r["origin_run"] != target)
    assert report["times"].startswith("times compared: this machine's hardware is the run's")
    by = {c["name"]: c for c in report["checks"]}
    assert by["time_to_accuracy"]["recorded"] == run.figures["time_to_accuracy"]
    assert all(c["agrees"] for c in report["checks"] if "time" not in c["name"]), report
    load = _allowed(tmp_path / "l.sqlite", report["run_id"])
    for name in ("time_to_accuracy", "evaluation times"):
        c = by[name]
        slower = too_fast(c["recorded"], c["reproduced"], load)  # than even this load explains
        assert c["agrees"] is (judged(load) and not slower), c
        assert c["inconclusive"] is (not judged(load) and not slower), c
        if not judged(load):  # too loaded to judge: never agrees
            assert c["tolerance"].startswith("not judged: this machine was too loaded")
    assert report["verdict"] != "agrees" or judged(load), report
    # caught for sure only where the tolerance resolves 2x with a quarter to spare for the
    # honest spread: (RATIO * T/2 + SLACK_S) * load is then well under T, i.e. T of a second or
    # more on a quiet machine
    resolves = judged(load) and true.figures["time_to_accuracy"] >= 1.25 * load * (
        RATIO * run.figures["time_to_accuracy"] + SLACK_S)
    quiet = _quiet(true._json("details").get("load_average"))
    if resolves and quiet:  # quiet: the origin's spread below 2x (by d500's own share: the
        # suite's share of the whole machine lets a loaded origin, slowed by this suite's
        # neighbours, be reproduced faster than it ran)
        assert report["verdict"] == "disagrees", report
        assert not by["time_to_accuracy"]["agrees"] and not by["evaluation times"]["agrees"]
    # both runs halved: the judged ones' times judged together too, the slack of the sum
    # SLACK_S x sqrt 2; a run too loaded to judge is left out of the sum
    timed = [(c["recorded"], c["reproduced"], _allowed(tmp_path / "l.sqlite", r["run_id"]))
             for r in (report, second) for c in r["checks"] if c["name"] == "time_to_accuracy"]
    timed = [t for t in timed if judged(t[2])]
    if len(timed) < 2:
        assert found["pooled"] == [], found["pooled"]
        together = {"agrees": True}
    else:
        (together,) = found["pooled"]
        assert together["recorded"] == pytest.approx(sum(a for a, _, _ in timed))
        assert together["agrees"] is not too_fast(
            sum(a for a, _, _ in timed), sum(b for _, b, _ in timed),
            max(t[2] for t in timed), SLACK_S * 2 ** 0.5), together
    bad = any(not r["agrees"] for r in (report, second)) or not together["agrees"]
    assert found["agrees"] is not bad
    assert result.returncode == (1 if bad else 0), result.stderr


def test_a_submission_changed_after_its_runs_is_not_reproducible(digits_package, rules_dir,
                                                                 tmp_path):
    def edit(found: dict[str, bytes]) -> None:
        name = SUBMISSION_FILES + "submission.yaml"
        found[name] = found[name].replace(b"lr: 0.05", b"lr: 0.06")

    changed = repack(digits_package, tmp_path / "changed.tar.gz", edit)
    result = rp.reproduce(Package.open(changed), runs=2, seed=0, rules_dir=rules_dir,
                          ledger=tmp_path / "l.sqlite")
    assert not result.agrees and len(result.runs) == 2
    for report in result.runs:
        assert report.run_id is None and report.problem.startswith("not reproducible: it ran "
                                                                   "with submission file(s) "
                                                                   "not in the package")
        assert "submission.yaml" in report.disagreements()[0]
    assert Ledger(tmp_path / "l.sqlite").runs() == []  # nothing ran


def test_more_runs_than_the_package_has_is_exit_2(digits_package, rules_dir, run_d500, tmp_path):
    result = run_d500(None, "reproduce", str(digits_package), "--runs", "7", "--rules",
                      str(rules_dir), "--ledger", str(tmp_path / "l.sqlite"))
    assert result.returncode == 2
    assert result.stderr.strip() == ("d500 reproduce: error: --runs 7: the package has 6 "
                                     "run(s) this command can re-run; give --runs 6 or fewer")
    assert result.stdout == "" and not (tmp_path / "l.sqlite").exists()  # nothing created


def test_a_one_run_package_without_runs_names_the_default(tmp_path):
    """`d500 reproduce PKG` of a package of one run: the default --runs 2 is named, and the
    count to give (a new user gave no --runs)."""
    from types import SimpleNamespace

    from d500.competition.reproduce import choose
    from d500.errors import UsageError
    with pytest.raises(UsageError) as caught:
        choose([SimpleNamespace(origin_id=1)], 2, 0)
    assert str(caught.value) == ("--runs 2: the package has 1 run(s) this command can re-run; "
                                 "give --runs 1 (2 is the default)")


def test_a_workload_that_is_not_the_rulebooks_is_refused(digits_package, run_d500, tmp_path):
    # the fixture's digits-mlp.yaml (seeds 2, 8 epochs) is not d500's own levels/ file
    result = run_d500(tmp_path / "home", "reproduce", str(digits_package), "--runs", "1",
                      "--seed", "3")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "differs from the rulebook's" in result.stderr
    assert "reproduction runs only the rules" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "ledger.sqlite").exists() or \
        Ledger(tmp_path / "home" / "ledger.sqlite").runs() == []


def test_not_a_package_is_exit_2(tmp_path, run_d500):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a package")
    result = run_d500(tmp_path, "reproduce", str(junk))
    assert result.returncode == 2 and "not a d500 package" in result.stderr


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec beside Python")
def test_a_level3_run_is_reproduced_at_its_world_size(tmp_path, run_d500):
    """A real 2-rank sync run under d500's own rulebook, packaged and re-run under mpiexec -n 2:
    the same figures to the last bit on this machine, recorded as one rank-0 run of 2; its
    times judged as level 2's are, at the load its judge measured while it ran (a reproduction
    1.6x its run at load 10 was once judged as if on an idle machine)."""
    home = tmp_path / "entrant"
    report = launch_train(RULEBOOK / "3-distributed" / "digits-mlp.yaml",
                          EXAMPLES / "sync", 2, extra=["--seed", "0"],
                          env={**os.environ, "D500_HOME": str(home)}, timeout=600)
    assert report.runs and report.runs[0]["status"] == "succeeded", report.summary
    package = tmp_path / "sync.tar.gz"
    made = run_d500(home, "package", str(EXAMPLES / "sync"), "--out", str(package))
    assert made.returncode == 0, made.stderr
    ledger = tmp_path / "organiser" / "ledger.sqlite"
    result = run_d500(None, "reproduce", str(package), "--runs", "1", "--ledger", str(ledger),
                      "--json")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert not found["seed_given"] and found["drawn_from"] == [1]
    (run,) = found["runs"]
    assert {"status", "epochs", "steps", "test_accuracy", "evaluations", "bytes_per_step",
            "bytes_received_per_step"} <= {c["name"] for c in run["checks"]}
    times = ("time_to_accuracy", "evaluation times")  # the only checks load may fail
    assert all(c["agrees"] for c in run["checks"] if c["name"] not in times), run
    (local,) = Ledger(ledger).runs()
    # the load: measured by the judge (its job's processes' CPU read from /proc: own_cpu) and
    # the one the time rule widened by
    watched = Ledger(ledger).get(local["id"])["details"]["load_average"]
    assert watched["own_cpu"] > 0 and "during" in watched, watched
    timed = {c["name"]: c for c in run["checks"] if c["name"] in times}
    assert len(timed) == 2 and run["times"].startswith("times compared"), run
    load = _allowed(ledger, local["id"])  # at 2 ranks x 1 thread
    for c in timed.values():  # an honest run: never slower than its load explains
        assert not too_fast(c["recorded"], c["reproduced"], load), (c, watched)
        assert (c["agrees"], c["inconclusive"]) == (judged(load), not judged(load)), c
    agrees = all(c["agrees"] for c in run["checks"])
    assert (run["world_size"], run["verdict"]) == (2, "agrees" if agrees else "inconclusive")
    assert found["agrees"] is agrees and result.returncode == (0 if agrees else 1), result.stderr
    assert run["threads"].startswith("1 (recorded by the origin; ")  # one rank's count
    assert (local["level"], local["world_size"], local["rank"]) == (3, 2, 0)
    origin = Package.open(package).runs()[0]
    for name in ("epochs", "steps", "val_accuracy", "test_accuracy", "bytes_per_step"):
        assert local["figures"][name] == origin.figures[name], name
    assert local["details"]["reproduction"]["origin_run"] == 1
    assert local["details"]["scheme"] == "sync"
    # its ranks ran at the recorded count, and its provenance says so (issue 22, item 2)
    assert Ledger(ledger).get(local["id"])["provenance"]["threads"] == {"count": 1,
                                                                      "set_by": "--threads"}

def test_a_run_is_reproduced_at_the_thread_count_it_recorded(rules_dir, entry_dir, tmp_path,
                                                             run_d500):
    """An entry's first required seed trained with --threads 1 (here d500's default, and
    torch's, would be this machine's 2 cores): the reproduction runs at the recorded 1 and says
    so. (Only that run is drawn and asserted: its other seed and its tuning would add 5 runs.)"""
    home, workload = tmp_path / "entrant", str(rules_dir / "2-training" / "digits-mlp.yaml")
    done = run_d500(home, "train", workload, "--submission", str(entry_dir), "--threads", "1",
                    "--seeds", "1")
    assert done.returncode in (0, 1), done.stderr
    package = tmp_path / "threads.tar.gz"
    made = run_d500(home, "package", str(entry_dir), "--out", str(package))
    assert made.returncode == 0, made.stderr
    first = _seed_runs(package)[0]
    ledger = tmp_path / "organiser" / "ledger.sqlite"
    result = run_d500(None, "reproduce", str(package), "--runs", "1", "--seed",
                      str(draw_seed(package, 1, {first})), "--rules", str(rules_dir),
                      "--ledger", str(ledger), "--json")
    (run,) = json.loads(result.stdout)["runs"]
    wrong = [c for c in run["checks"] if not c["agrees"]]  # times not judged, at most
    assert all(c["name"] in ("time_to_accuracy", "evaluation times") and c["inconclusive"]
               for c in wrong), run
    assert run["origin_run"] == first and run["verdict"] == (
        "inconclusive" if wrong else "agrees")
    assert result.returncode == (1 if wrong else 0), result.stdout + result.stderr
    assert run["threads"] == "1 (recorded by the origin; --threads)"
    (local,) = Ledger(ledger).runs()
    assert Ledger(ledger).get(local["id"])["provenance"]["threads"] == {"count": 1,
                                                                      "set_by": "--threads"}


def test_a_run_recorded_before_threads_were_recorded_has_its_count_inferred():
    from d500 import provenance
    from d500.competition.reproduce_prepare import origin_threads
    env = provenance.collect()
    cpu = env["cpu"]
    old = {**env, "threads": None}  # a level-2 run recorded before train/tune took --threads
    count, why = origin_threads(old, "torch", None)
    assert count == cpu["physical_cores"]
    assert why == ("inferred, as the origin recorded no thread count: torch's default on the "
                   "origin, its physical cores")
    count, why = origin_threads({k: v for k, v in old.items() if k != "threads"}, "tensorflow",
                                None)
    assert count == cpu["usable_cores"]
    assert why == ("inferred, as the origin recorded no thread count: the framework's default "
                   "on the origin, its usable cores")
    count, why = origin_threads(old, "torch", 2)
    assert count == max(1, cpu["logical_cores"] // 2) and why.startswith("inferred, as ")
    recorded = {**env, "threads": {"count": 3, "set_by": "--threads"}}
    assert origin_threads(recorded, "torch", 2) == (3, "recorded by the origin; --threads")
    unknown = ("unknown (the origin recorded neither a thread count nor its CPU): this "
               "machine's default")
    assert origin_threads({}, "torch", None) == (None, unknown)


def test_level0_validations_are_validated_again(tmp_path, run_d500):
    """A real operator entry's `d500 op validate` runs (a rulebook case, and a case given by
    shapes) packaged and validated again here: the same verdicts, errors shown beside them."""
    home, entry = tmp_path / "entrant", EXAMPLES / "numpy-im2col-conv"
    for args in (["--case", str(RULEBOOK / "0-operators" / "conv-3x3-pad1.yaml")],
                 ["--input-shape", "1,2,5,5", "--input-shape", "3,2,3,3", "--seed", "4"]):
        done = run_d500(home, "op", "validate", str(entry), *args)
        assert done.returncode == 0, done.stdout + done.stderr
    package = tmp_path / "conv.tar.gz"
    made = run_d500(home, "package", str(entry), "--out", str(package))
    assert made.returncode == 0, made.stderr
    ledger = tmp_path / "organiser" / "ledger.sqlite"
    result = run_d500(None, "reproduce", str(package), "--runs", "2", "--seed", "1",
                      "--ledger", str(ledger), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert [r["verdict"] for r in found["runs"]] == ["agrees", "agrees"]
    for r in found["runs"]:
        (check,) = r["checks"]
        assert (check["name"], check["recorded"], check["reproduced"]) == (
            "validation", "passed", "passed")
        assert "forward_error" in check["note"]
    local = Ledger(ledger).runs()
    assert [(r["level"], r["status"], r["seed"]) for r in local] == [(0, "succeeded", 0),
                                                                      (0, "succeeded", 4)]
    assert all(r["details"]["reproduction"]["package"] == found["sha256"] for r in local)
    assert local[1]["workload"] == "Conv(1x2x5x5, 3x2x3x3) float32"

# -- the comparison rules on hand-made series -------------------------------------------------

SIZES = {"validation": 300, "test": 300}


def _series(vals: list[int], tests: list[int], steps: int = 37) -> Series:
    return Series([(steps * (i + 1), float(i + 1), v / 300, t / 300)
                   for i, (v, t) in enumerate(zip(vals, tests))])


def _figures(series: Series, target: float = 0.97) -> dict:
    met = next((p for p in series.points if p[2] >= target), None)
    last = series.points[-1]
    if met is None:
        return {"epochs": float("inf"), "steps": float("inf"), "val_accuracy": last[2],
                "final_test_accuracy": last[3]}
    return {"epochs": met[1], "steps": float(met[0]), "val_accuracy": met[2],
            "test_accuracy": met[3], "final_test_accuracy": met[3]}


def _verdicts(a: Series, b: Series, status=("succeeded", "succeeded")) -> dict[str, bool]:
    return {c.name: c.agrees for c in compare(_figures(a), _figures(b), status, (a, b), SIZES,
                                              0.97)}


def test_identical_series_agree_and_say_so():
    a = _series([250, 280, 291], [248, 281, 286])
    checks = compare(_figures(a), _figures(a), ("succeeded", "succeeded"), (a, a), SIZES, 0.97)
    assert all(c.agrees for c in checks)
    assert next(c for c in checks if c.name == "evaluations").note == \
        "identical at all 3 common evaluations"


def test_two_samples_apart_agree_three_do_not():
    a = _series([250, 280, 291], [248, 281, 286])
    assert all(_verdicts(a, _series([250, 280, 291], [248, 281, 288])).values())
    v = _verdicts(a, _series([250, 280, 291], [248, 281, 289]))
    assert not v["test_accuracy"] and not v["evaluations"] and v["epochs"] and v["steps"]


def test_a_crossing_one_evaluation_later_agrees_only_when_it_was_borderline():
    a = _series([250, 280, 291], [248, 281, 286])
    late = _series([250, 280, 290, 293], [248, 281, 286, 287])  # 290/300: one sample short
    v = _verdicts(a, late)
    assert v["epochs"] and v["steps"] and v["test_accuracy"], v
    far = _series([250, 280, 285, 293], [248, 281, 286, 287])  # 6 samples short: not noise
    v = _verdicts(a, far)
    assert not v["epochs"] and not v["steps"] and not v["evaluations"]


def test_a_crossing_two_evaluations_later_disagrees_even_when_borderline():
    """Reassociation moves a crossing by one evaluation at most: a reproduction that met the
    target two evaluations after the recorded run disagrees, although it stayed within the
    accuracy tolerance of the target at both evaluations in between."""
    a = _series([250, 280, 291], [248, 281, 286])  # the target met at step 111
    late = _series([250, 280, 290, 290, 293], [248, 281, 286, 286, 287])  # at 185
    checks = {c.name: c for c in compare(_figures(a), _figures(late), ("succeeded",) * 2,
                                         (a, late), SIZES, 0.97)}
    assert (checks["steps"].recorded, checks["steps"].reproduced) == (111.0, 185.0)
    assert not checks["steps"].agrees and not checks["epochs"].agrees
    assert checks["steps"].note == "" and checks["evaluations"].agrees
    v = _verdicts(late, a)  # the recorded run the late one: the same
    assert not v["steps"] and not v["epochs"]


def test_a_different_status_disagrees():
    a = _series([250, 280, 291], [248, 281, 286])
    v = _verdicts(a, a, ("succeeded", "missed"))
    assert not v["status"] and v["epochs"]


def test_the_draw_is_seeded_and_bounded():
    class Run:
        def __init__(self, i: int):
            self.origin_id = i
    runs = [Run(i) for i in (5, 1, 9, 3)]
    first = [r.origin_id for r in rp.choose(runs, 2, 7)]
    assert first == [r.origin_id for r in rp.choose(list(reversed(runs)), 2, 7)]
    assert first == sorted(first) and len(set(first)) == 2
    assert {tuple(r.origin_id for r in rp.choose(runs, 2, s)) for s in range(50)} != {
        tuple(first)}  # other seeds, other choices
    with pytest.raises(rp.UsageError, match="--runs 5: the package has 4 run"):
        rp.choose(runs, 5, 0)


def test_a_time_budget_cut_is_inconclusive_not_a_disagreement():
    a = _series([250, 280, 285, 288, 289, 291], [248, 281, 284, 285, 286, 286])
    cut = _series([250, 280, 285, 288], [248, 281, 284, 285])  # a slower machine: 4 epochs
    checks = compare(_figures(a), _figures(cut), ("succeeded", "missed"), (a, cut), SIZES, 0.97)
    by = {c.name: c for c in checks}
    assert not by["status"].agrees and by["status"].inconclusive
    assert "spent its time budget (max_seconds) at step 148" in by["status"].note
    assert by["evaluations"].agrees and not by["epochs"].agrees and by["epochs"].inconclusive
    report = rp.RunReport(1, 2, "digits-mlp", "torch", 0, checks=checks)
    assert report.verdict == "inconclusive" and not report.agrees
    other = _series([250, 280, 275, 288], [248, 281, 284, 285])  # and a different trajectory
    checks = compare(_figures(a), _figures(other), ("succeeded", "missed"), (a, other), SIZES,
                     0.97)
    assert not any(c.inconclusive for c in checks)
    assert rp.RunReport(1, 2, "digits-mlp", "torch", 0, checks=checks).verdict == "disagrees"
