"""--threads: one count reaches torch, TensorFlow (intra and inter), onnxruntime sessions and
NumPy's BLAS, is recorded in every run's provenance and shown on the leaderboard; TensorFlow already
running with another count is an error that says why. Each case runs in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def python(code: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=ROOT, env=env)


def d500(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT, env=env)


def test_the_count_reaches_every_framework(tmp_path):
    count = len(os.sched_getaffinity(0)) + 1  # more than the usable cores: never a default
    out = python(f"""
        import json, os
        from d500 import builders, threads
        threads.configure({count}, threads.frameworks(
            ["torch", "tensorflow", "onnxruntime", "reference"]))
        import tensorflow as tf, torch
        from threadpoolctl import threadpool_info
        from d500.backends.onnxruntime import OnnxRuntimeBackend
        exe = OnnxRuntimeBackend.prepare(builders.build("mlp", (1, 8, 8)))
        options = exe._session.get_session_options()
        print(json.dumps({{
            "torch": torch.get_num_threads(),
            "tf": [tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads()],
            "onnxruntime": [options.intra_op_num_threads, options.inter_op_num_threads],
            "blas": sorted({{p["num_threads"] for p in threadpool_info()
                            if p["user_api"] == "blas"}}),
            "env": os.environ.get("OMP_NUM_THREADS"), "recorded": threads.recorded(),
            "actual": threads.actual()}}))
        tf.constant([1.0]) + 1  # TensorFlow starts with the count set
        assert tf.config.threading.get_intra_op_parallelism_threads() == {count}
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["torch"] == count and found["tf"] == [count, count]
    assert found["onnxruntime"] == [count, count] and found["blas"] == [count]
    assert found["env"] is None  # child processes (MPI ranks) still share the cores their way
    assert found["recorded"] == {"count": count, "set_by": "--threads"}
    assert found["actual"]["torch"] == count and found["actual"]["blas"] == [count]


def test_without_threads_every_framework_gets_the_idle_cores(tmp_path):
    out = python("""
        import json, os
        from d500 import provenance, threads
        assert threads.recorded() is None and provenance.collect()["threads"] is None
        n = threads.configure(None, ["torch"])
        import torch
        print(json.dumps([n, len(os.sched_getaffinity(0)), torch.get_num_threads(),
                          threads.recorded(), provenance.collect()["threads"]]))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    n, cores, torch_threads, recorded, provenance = json.loads(out.stdout)
    assert 1 <= n <= cores and n == torch_threads
    assert recorded == provenance == {
        "count": n, "set_by": f"default: the cores idle when the run started ({n} of {cores} "
                              f"usable)"}


@pytest.mark.parametrize(("others", "idle"), [(0.1, 2), (0.6, 1), (1.3, 1), (7.5, 1), (None, 2)])
def test_the_default_is_the_usable_cores_less_what_others_take(monkeypatch, others, idle):
    from d500 import provenance, threads
    monkeypatch.setattr(provenance, "usable_cores", lambda: 2)
    monkeypatch.setattr(provenance, "others_now", lambda seconds: others)
    monkeypatch.setattr(threads, "_idle", None)
    assert threads.default() == idle
    monkeypatch.setattr(provenance, "others_now", lambda seconds: 0.0)
    assert threads.default() == idle  # measured once, when the run starts


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one usable core")
def test_a_default_tensorflow_already_ran_with_keeps_its_count(tmp_path):
    """In-process use (a test, a notebook): TensorFlow ran at its own default (the usable cores)
    before d500 chose fewer idle ones; the default is then TensorFlow's count, and says so."""
    out = python("""
        import json, os
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # TensorFlow's runtime starts: its pools are fixed now
        from d500 import threads
        threads._idle = 1  # fewer idle cores than usable ones
        print(json.dumps([threads.configure(None), len(os.sched_getaffinity(0)),
                          threads.recorded()["set_by"]]))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    n, cores, why = json.loads(out.stdout)
    assert n == cores and why.startswith("default: the cores this process may use") \
        and "already running" in why


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one usable core")
def test_a_cpu_hog_on_every_core_leaves_one_thread(tmp_path):
    """A busy process per usable core (outside the run's process tree): without --threads the
    run gets 1 thread, not the cores it may use (the attack: a crowded machine ranking a
    framework by its contention)."""
    cores = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        out = python("""
            from d500 import threads
            print(threads.configure(None, ["numpy"]))
        """, tmp_path)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1", f"{out.stdout.strip()} threads with {cores} hogs running"


def test_tensorflow_already_running_cannot_change_its_count(tmp_path):
    out = python("""
        import tensorflow as tf
        tf.constant([1.0]) + 1  # TensorFlow's runtime starts with its own pools
        from d500 import threads
        from d500.errors import UsageError
        threads.configure(None, ["tensorflow"])  # its own default is the default count
        try:
            threads.configure(3, ["tensorflow"])
        except UsageError as err:
            print(err)
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "TensorFlow already runs with its default intra-op threads in this process and cannot "
        "change to 3: the thread count must be set before TensorFlow runs anything (give "
        "--threads to a new d500 process)")


def test_net_bench_and_op_bench_record_the_count_and_the_load(tmp_path):
    home = tmp_path / "home"
    bench = d500("net", "bench", "mlp-mnist", "--backends", "onnxruntime,torch", "--budget",
                 "0.05", "--threads", "1", "--json", home=home)
    assert bench.returncode == 0, bench.stderr
    op = d500("op", "bench", "submissions/torch-softmax", "--backends", "onnxruntime",
              "--budget", "0.05", "--threads", "1", "--json", home=home)
    assert op.returncode == 0, op.stderr
    from d500.leaderboard import render
    from d500.ledger import Ledger
    ledger = Ledger(home / "ledger.sqlite")
    runs = [ledger.get(r["id"]) for r in ledger.runs()]
    assert {r["level"] for r in runs} == {0, 1} and len(runs) >= 4
    for run in runs:
        assert run["provenance"]["threads"] == {"count": 1, "set_by": "--threads"}
        load = run["details"]["load_average"]
        assert len(load["start"]) == len(load["end"]) == 3 and load["loaded"] in (True, False)
    text = render(ledger, level=1, fmt="md")
    assert "· 1 thread ·" in text
    bad = d500("net", "bench", "mlp-mnist", "--threads", "0", home=home)
    assert bad.returncode == 2 and "expected a number of threads >= 1, got '0'" in bad.stderr


def test_run_takes_threads(tmp_path):
    home = tmp_path / "home"
    result = d500("run", "--quick", "--level", "1", "--backends", "onnxruntime", "--threads",
                  "2", "--no-html", "--quiet-wait", "0", home=home)  # the wait: test_provenance.py
    assert result.returncode == 0, result.stdout + result.stderr
    from d500.ledger import Ledger
    ledger = Ledger(home / "ledger.sqlite")
    counts = {ledger.get(r["id"])["provenance"]["threads"]["count"] for r in ledger.runs()}
    assert counts == {2}


def test_more_threads_than_a_typo_allows_is_one_line(tmp_path):
    # 10**20 was a torch traceback (Overflow when unpacking long long); 5000 on 2 cores ran
    from d500 import provenance
    too_many = str(4 * provenance.usable_cores() + 1)
    for count in (too_many, "99999999999999999999"):
        out = d500("train", "digits-mlp", "--submission", "sgd-momentum", "--seed", "0",
                   "--threads", count, home=tmp_path / "home")
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
        assert f"expected at most {int(too_many) - 1} threads" in out.stderr
    assert not (tmp_path / "home" / "ledger.sqlite").exists()
