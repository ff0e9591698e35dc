"""Level 2's thread count and load, on real digits-mlp runs: `d500 train --threads N` and
`d500 tune --threads N` give torch and TensorFlow that count inside the training process (an
entry's optimizer reads it while it trains), every run's provenance records it and how it was
chosen, every run records the load averages at its start and end, and the leaderboard marks a
level-2 run timed on a loaded machine (a fake /proc/loadavg, as tests/test_provenance.py does).
Under `mpiexec -n 2 d500 tune` each rank gets its share of the host's cores, as level 3 does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from d500.distributed import launch
from d500.ledger import Ledger
from tests.helpers import seed_peak
from tests.training.rendezvous import MEET

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
CORES = len(os.sched_getaffinity(0))

NOTING = '''\
"""Momentum SGD that writes, at its first update, the thread counts the frameworks of its own
training process report (a worker of the d500 process: to $NOTE_DIR/<its rank>.json, once per
d500 process); under $D500_MEET_DIR the
ranks' first trials overlap (tests/training/rendezvous.py)."""

import json
import os
import sys
from pathlib import Path

from d500.training.optimizers.sgd import Momentum
''' + MEET + '''

class Noting(Momentum):
    name = "noting"

    def update(self, ops, params, grads, state, lr, t):
        meet(t)
        out = Path(os.environ["NOTE_DIR"]) / f"{who()}.json"
        if not out.exists():
            found = {}
            if "torch" in sys.modules:
                found["torch"] = sys.modules["torch"].get_num_threads()
            if "tensorflow" in sys.modules:
                threading = sys.modules["tensorflow"].config.threading
                found["tensorflow"] = [threading.get_intra_op_parallelism_threads(),
                                       threading.get_inter_op_parallelism_threads()]
            out.write_text(json.dumps(found))
        super().update(ops, params, grads, state, lr, t)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A digits-mlp with a low target (validation accuracy 0.9: the entry meets it in about 2
    epochs, where the workload's 0.97 takes about 6; what is tested here is the threads and the
    load, not the training) and a small budget, and the noting entry, a momentum SGD with a
    small search space."""
    folder = tmp_path_factory.mktemp("threads")
    text = (ROOT / "levels" / "2-training" / "digits-mlp.yaml").read_text()
    workload = yaml.safe_load(text)
    workload.update(budget={"max_epochs": 8, "max_seconds": 60},
                    target={**workload["target"], "value": 0.9})
    workload.pop("reference_convergence")
    (folder / "digits-mlp.yaml").write_text(yaml.safe_dump(workload))
    entry = folder / "noting"
    entry.mkdir()
    data = yaml.safe_load((ROOT / "submissions" / "sgd-momentum" / "submission.yaml")
                          .read_text())
    data.update(name="noting", optimizer="noting.py:Noting",
                search_space={"lr": {"min": 0.04, "max": 0.06}})
    (entry / "submission.yaml").write_text(yaml.safe_dump(data))
    (entry / "noting.py").write_text(NOTING)
    return {"workload": folder / "digits-mlp.yaml", "entry": entry, "root": folder}


def d500(home: Path, notes: Path, *args: str, load: float | None = None,
         launcher: list[str] = ()) -> subprocess.CompletedProcess:
    """`d500 ARGS` in a fresh process (`launcher` before it: mpiexec, whose ranks' first trials
    then overlap); with `load`, the machine's 1-minute load average reads as that (a fake
    /proc/loadavg)."""
    notes.mkdir(parents=True, exist_ok=True)
    seed_peak(home)  # the session's peak FLOP/s, not measured again in every fresh home
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3",
           "NOTE_DIR": str(notes)}
    if launcher:
        (notes / "meet").mkdir()
        env["D500_MEET_DIR"] = str(notes / "meet")
    for name in ("OMP_NUM_THREADS", "D500_DATA", *launch.LAUNCHER_VARIABLES,
                 *launch.LOCAL_SIZE_VARIABLES):
        env.pop(name, None)
    code = "import sys\nfrom d500 import cli, provenance\n"
    if load is not None:
        code += f"provenance.loadavg_text = lambda: '{load:.2f} 0.50 0.25 1/234 5678'\n"
        code += "provenance.busy_seconds = lambda: None\n"  # the averages decide, not /proc/stat
    code += f"sys.exit(cli.main({list(args)!r}))\n"
    return subprocess.run([*launcher, sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT, env=env)


def notes(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def runs(home: Path) -> list[dict]:
    ledger = Ledger(home / "ledger.sqlite")
    return [ledger.get(r["id"]) for r in ledger.runs()]


def test_train_threads_reaches_torch_is_recorded_with_the_load(setup, tmp_path):
    home = tmp_path / "home"
    done = d500(home, tmp_path / "notes", "train", str(setup["workload"]), "--submission",
                str(setup["entry"]), "--threads", "1", "--seed", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert notes(tmp_path / "notes") == [{"torch": 1}]  # in the training process, training
    (run,) = runs(home)
    assert run["status"] == "succeeded"
    assert run["provenance"]["threads"] == {"count": 1, "set_by": "--threads"}
    load = run["details"]["load_average"]
    assert len(load["start"]) == len(load["end"]) == 3 and load["loaded"] in (True, False)
    assert load["usable_cores"] == CORES and "job_load" not in load
    # the worker's threads' scheduler counts, read before it ended (LoadWatch.mark): a level-2
    # run recorded no waits when they were read at finish, so its reproduction had no burst
    # protection; the time rule's slowdown reads them (reproduce_time._queued)
    from d500.competition.reproduce_time import _queued, slowdown
    ran, waited = load["waits"]
    assert ran > 0 and waited >= 0 and 0 <= load["waited"] < 1, load
    explained = min(waited, load["during"] * load["wall"] / CORES)
    assert _queued(load, 1) == round((ran + explained) / ran, 2)
    assert slowdown(load, 1) >= _queued(load, 1)
    burst = {**load, "waits": [ran, ran], "during": CORES / 2, "wall": 4 * ran}
    assert slowdown(burst, 1) >= 2.0  # half the runnable time waiting: twice as slow


def test_train_without_threads_gives_every_framework_the_default(setup, tmp_path):
    home = tmp_path / "home"
    done = d500(home, tmp_path / "notes", "train", str(setup["workload"]), "--submission",
                str(setup["entry"]), "--seed", "0")
    assert done.returncode == 0, done.stderr
    (run,) = runs(home)
    n = run["provenance"]["threads"]["count"]  # the cores idle when it started, at least 1
    assert 1 <= n <= CORES and notes(tmp_path / "notes") == [{"torch": n}]
    assert run["provenance"]["threads"]["set_by"] == (
        f"default: the cores idle when the run started ({n} of {CORES} usable)")


def test_train_threads_reaches_tensorflow(setup, tmp_path):
    home = tmp_path / "home"
    done = d500(home, tmp_path / "notes", "train", str(setup["workload"]), "--submission",
                str(setup["entry"]), "--backend", "tensorflow", "--threads", "1", "--seed", "0")
    assert done.returncode == 0, done.stderr
    assert notes(tmp_path / "notes") == [{"tensorflow": [1, 1]}]  # traced in its tf.function
    (run,) = runs(home)
    assert run["backend"] == "tensorflow" and run["status"] == "succeeded"
    assert run["provenance"]["threads"] == {"count": 1, "set_by": "--threads"}
    assert isinstance(run["details"]["load_average"]["loaded"], bool)


def test_tune_threads_reaches_every_trial(setup, tmp_path):
    home = tmp_path / "home"
    done = d500(home, tmp_path / "notes", "tune", str(setup["workload"]), "--submission",
                str(setup["entry"]), "--studies", "1", "--trials", "2", "--threads", "1",
                "--json")
    assert done.returncode == 0, done.stderr
    assert notes(tmp_path / "notes") == [{"torch": 1}]  # both trials' workers
    found = runs(home)
    assert len(found) == 2 and all(r["study"] is not None for r in found)
    for run in found:
        assert run["provenance"]["threads"] == {"count": 1, "set_by": "--threads"}
        assert len(run["details"]["load_average"]["end"]) == 3


def test_a_bad_thread_count_is_one_line_and_exit_2(setup, tmp_path):
    for command in ("train", "tune"):
        done = d500(tmp_path / "home", tmp_path / "notes", command, str(setup["workload"]),
                    "--submission", str(setup["entry"]), "--threads", "0")
        assert done.returncode == 2, done.stderr
        assert "--threads: expected a number of threads >= 1, got '0'" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "ledger.sqlite").exists()


def test_the_leaderboard_marks_a_level2_run_on_a_loaded_machine(setup, tmp_path):
    from d500.leaderboard import ranking, render, text
    home = tmp_path / "home"
    for seed, load in (("0", 0.0), ("1", 3.0 * CORES)):  # idle, then busy with others' work
        done = d500(home, tmp_path / "notes", "train", str(setup["workload"]), "--submission",
                    str(setup["entry"]), "--threads", "1", "--seed", seed, load=load)
        assert done.returncode == 0, done.stderr
    by_seed = {r["seed"]: r["details"]["load_average"] for r in runs(home)}
    assert by_seed[0]["loaded"] is False and by_seed[0]["start"][0] == 0.0
    assert by_seed[1]["loaded"] is True and by_seed[1]["start"][0] == round(3.0 * CORES, 2)
    ledger = Ledger(home / "ledger.sqlite")
    [board] = ranking.build(ledger, level=2)
    clean, loaded = board.entries  # never pooled: the loaded run is a row apart, after
    assert [r["seed"] for r in clean.runs] == [0] and [r["seed"] for r in loaded.runs] == [1]
    assert not clean.loaded and loaded.loaded and text.load_mark(clean) == ""
    assert text.load_mark(loaded).startswith("⚠ loaded machine: 1 of 1 timed run(s), other "
                                             "processes' load up to ")
    assert text.load_mark(loaded).endswith(f"on {CORES} cores")
    shown = render(ledger, level=2, fmt="md")
    assert "⚠ loaded machine: 1 of 1 timed run(s)" in shown and "· 1 thread ·" in shown


# -- each rank's share of the cores, as level 3 gives it ---------------------------------------

@pytest.fixture
def bare(monkeypatch):
    for name in (*launch.LAUNCHER_VARIABLES, *launch.LOCAL_SIZE_VARIABLES, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(launch, "_shared", None)
    return monkeypatch


def test_a_rank_shares_its_hosts_cores_unless_the_user_chose(bare):
    cores = os.cpu_count() or 1
    assert launch.core_share() is None  # one process: d500's default
    bare.setenv("MPI_LOCALNRANKS", "2")
    why = f"default under MPI: this host's {cores} cores shared by its 2 ranks"
    assert launch.core_share() == (max(1, cores // 2), why)
    launch.share_cores()  # what level 3 gives torch through the environment: the same count
    assert os.environ["OMP_NUM_THREADS"] == str(launch.core_share()[0])
    assert launch.core_share()[1].startswith("default under MPI")  # d500's own, not the user's
    bare.setenv("OMP_NUM_THREADS", "3")
    assert launch.core_share() == (3, "OMP_NUM_THREADS, as the user set it for the MPI ranks")
    bare.setenv("MPI_LOCALNRANKS", "1")
    assert launch.core_share()[0] == 3
    bare.delenv("OMP_NUM_THREADS")
    assert launch.core_share() is None


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside Python")
def test_tune_under_mpiexec_gives_each_rank_its_share(setup, tmp_path):
    home = tmp_path / "home"
    share = max(1, (os.cpu_count() or 1) // 2)
    done = d500(home, tmp_path / "notes", "tune", str(setup["workload"]), "--submission",
                str(setup["entry"]), "--studies", "1", "--trials", "2",
                launcher=[str(MPIEXEC), "-n", "2"])  # one trial each: their first ones meet
    assert done.returncode == 0, done.stderr
    found = runs(home)
    assert {r["rank"] for r in found} == {0, 1}  # both ranks trained, each in its process
    assert notes(tmp_path / "notes") == [{"torch": share}, {"torch": share}]
    for run in found:
        assert run["provenance"]["threads"] == {
            "count": share, "set_by": f"default under MPI: this host's {os.cpu_count()} cores "
                                      f"shared by its 2 ranks"}
        load = run["details"]["load_average"]
        assert load["job_load"] == share  # the other rank's work is not others' load
        assert load["loaded"] in (True, False)
    explicit = d500(tmp_path / "home1", tmp_path / "notes1", "tune", str(setup["workload"]),
                    "--submission", str(setup["entry"]), "--studies", "1", "--trials", "2",
                    "--threads", "2", launcher=[str(MPIEXEC), "-n", "2"])
    assert explicit.returncode == 0, explicit.stderr
    assert {r["provenance"]["threads"]["count"] for r in runs(tmp_path / "home1")} == {2}


def test_load_record_takes_the_jobs_other_ranks_out(monkeypatch):
    """A parallel tuning's other rank on this host, training on its thread count, is the job's
    load, not other processes'."""
    from d500 import provenance, threads
    from d500.training.trainer import load_record
    cores = provenance.usable_cores()
    monkeypatch.setattr(provenance, "loadavg_text", lambda: f"{10.0 * cores:.2f} 0.50 0.25")
    monkeypatch.setattr(provenance, "busy_seconds", lambda: None)
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    monkeypatch.setattr(threads, "_setting", {"count": 1, "set_by": "--threads"})
    alone = load_record(provenance.LoadWatch())
    shared = load_record(provenance.LoadWatch(), world_size=2)
    assert "job_load" not in alone and shared["job_load"] == 1.0
    assert all(a - s == pytest.approx(1.0, abs=0.05)
               for a, s in zip(alone["others"], shared["others"], strict=True))
    assert shared["loaded"] is (max(shared["others"]) > provenance.loaded_share() * cores)
