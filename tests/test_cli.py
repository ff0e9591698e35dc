"""The `d500` command: instant help, and bad input as one line on stderr with exit code 2."""

from __future__ import annotations

import resource
import subprocess
import sys

import onnx
import pytest

from d500.builders import build
from tests.helpers import custom_op_model


def d500(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600, env=env, check=False)


def cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_help_is_instant_and_imports_no_framework():
    # its cost is the CPU time the process takes (0.07 s here): the wall time is 0.5 s with
    # three other busy processes on its core, and CI's machine may be that busy
    start = cpu_seconds_of_children()
    code = ("import sys; from d500.cli import main; main(['--help']); "
            "print(sorted(m for m in ('torch','tensorflow','onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    cpu = cpu_seconds_of_children() - start
    assert out.returncode == 0
    assert "conformance" in out.stdout
    assert out.stdout.strip().endswith("[]")
    assert cpu < 1.0, cpu


def test_output_cut_short_by_its_reader_ends_quietly():
    """`d500 --help | head -1`: the reader closes the pipe early; no traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before d500 writes a line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_rich_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """`d500 leaderboard --format terminal | head -1` prints through rich, whose own answer to a
    closed pipe is exit 1 (a failed check's code): d500 ends it as any other, exit 0."""
    import os

    from d500.ledger import Ledger
    Ledger(tmp_path / "ledger.sqlite").close()  # an empty ledger: a board saying so
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "leaderboard", "--format",
                             "terminal"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_unknown_command():
    out = d500("frobnicate")
    assert out.returncode == 2 and "frobnicate" in out.stderr
    assert out.stderr.count("\n") == 1


def one_line_exit_2(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert all(w in out.stderr for w in words), out.stderr


def test_unknown_backend():
    one_line_exit_2(d500("conformance", "--backend", "nosuch"), "nosuch")


def test_a_d500_home_under_a_quoted_tilde_is_in_the_users_home(tmp_path):
    import os
    env = {**os.environ, "HOME": str(tmp_path / "user"), "D500_HOME": "~/results"}
    out = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 2 and f"no ledger at {tmp_path}/user/results/ledger.sqlite: " \
        "$D500_HOME=~/results does not exist" in out.stderr, out.stderr  # the user's home's
    from d500.ledger import Ledger
    Ledger(tmp_path / "user" / "results" / "ledger.sqlite").close()
    out = subprocess.run([sys.executable, "-m", "d500.cli", "ledger", "list"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0 and f"{tmp_path}/user/results/ledger.sqlite" in out.stdout, out
    assert not (tmp_path / "~").exists()


def test_d500_home_that_is_a_file(tmp_path):
    import os
    (tmp_path / "home").write_text("")
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    one_line_exit_2(d500("ledger", "list", env=env), "D500_HOME=", "results directory")


@pytest.mark.parametrize("args, words", [
    (["net", "check", "model.onnx", "--seed", "-1"], ["--seed", "integer >= 0"]),
    # a seed SQLite cannot hold was an OverflowError traceback once the run was being recorded
    (["train", "digits-mlp", "--submission", "sgd-momentum", "--seed", str(2 ** 63)],
     ["--seed", "below 2**63"]),
    (["net", "bench", "mlp-mnist", "--budget", "inf"], ["--budget", "positive number"]),
    (["run", "--budget", "0"], ["--budget", "positive number"]),
    # drawing a billion trials was a 7.45 GiB MemoryError traceback; --jobs 10000 would start a
    # process (each importing its framework) for every chunk of node tests at once (the
    # missing entry and the mistyped --op stop them where the check is missing: this test never
    # does either)
    (["tune", "digits-mlp", "--trials", "1000000000", "--submission", "no-such-entry"],
     ["--trials", "at most 1,000,000"]),
    (["conformance", "--backend", "reference", "--op", "Reluu", "--jobs", "10000"],
     ["--jobs", "processes", "cores this process may use"])])
def test_bad_seed_and_budget(args, words):
    one_line_exit_2(d500(*args), *words)


def test_reference_refuses_what_it_cannot_run_before_its_first_run(tmp_path):
    """An inference-only backend was refused once the first run's progress bar had started;
    --ranks 0 ran every seed at the default 2 ranks (0 read as 'not given')."""
    import os
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    one_line_exit_2(d500("reference", "digits-mlp", "--runs", "10", "--backend", "onnxruntime",
                         env=env), "'onnxruntime' cannot train")
    one_line_exit_2(d500("reference", "digits-mlp", "--entry", "sync", "--ranks", "0", "--runs",
                         "1", env=env), "--ranks", "integer >= 1")  # --runs 1: never runs
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A truncated file, a non-ONNX file and a model with a custom-domain operator."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    data = build("lenet5", "digits").SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
    (tmp_path / "notes.onnx").write_text("these are my notes, not a model\n")
    onnx.save(custom_op_model(), tmp_path / "custom.onnx")
    return tmp_path


# `d500 net check MODEL` (level 1) is the command that reads a model file.
@pytest.mark.parametrize(("name", "words"), [
    ("cut.onnx", ["cut.onnx", "truncated"]),
    ("notes.onnx", ["notes.onnx", "not an ONNX model"]),
    ("missing.onnx", ["missing.onnx", "no such file"]),
    ("custom.onnx", ["'reference'", "com.example::FancyGelu", "opset 3", "'act1'"]),
])
def test_bad_model_files(models, name, words):
    out = d500("net", "check", str(models / name), "--backends", "reference", "--no-record")
    one_line_exit_2(out, *words)


def test_openblas_workers_do_not_spin_between_interleaved_timings(monkeypatch):
    # Set before NumPy loads; a user's own setting wins.
    code = ("import sys, d500.cli, os; assert 'numpy' not in sys.modules; "
            "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "4", out.stderr
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "10")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "10", out.stderr


def test_a_users_tensorflow_operator_file_prints_no_cpp_log_lines(tmp_path):
    """Issue 22 item 8, the same for level 0: the user's operator file imports TensorFlow itself,
    before any backend; the command's own log level keeps TensorFlow's absl / CPU-feature (AVX)
    lines off stderr when the user set none."""
    pytest.importorskip("tensorflow")
    import os
    from pathlib import Path
    ops = Path(__file__).resolve().parent / "operators" / "ops" / "tf_ops.py"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["D500_HOME"] = str(tmp_path / "home")
    result = d500("op", "validate", f"{ops}:TfSigmoid", "--input-shape", "4,4", env=env)
    assert result.returncode == 0, result.stderr
    for chatter in ("absl", "oneDNN", "cpu_feature_guard", "AVX", "I0000", "W0000"):
        assert chatter not in result.stderr, result.stderr


@pytest.mark.parametrize("args, words", [
    (["op", "validate", "sgd-momentum"],
     ["sgd-momentum/submission.yaml: a level-2 file (field 'level'), where this command takes "
      "level 0"]),
    (["train", "digits-mlp", "--submission", "numpy-im2col-conv"],
     ["numpy-im2col-conv/submission.yaml: a level-0 file (field 'level'), where this command "
      "takes level 2 or 3"])])
def test_an_entry_of_another_level_is_said_so(args, words, tmp_path):
    """Not the first field that level does not know ('unknown field optimizer')."""
    import os
    one_line_exit_2(d500(*args, env={**os.environ, "D500_HOME": str(tmp_path)}), *words)


def test_an_inference_only_backend_names_the_trainable_ones(tmp_path):
    import os

    from d500 import backends
    one_line_exit_2(d500("train", "digits-mlp", "--submission", "sgd-momentum", "--backend",
                         "openvino", "--seed", "2", env={**os.environ, "D500_HOME": str(tmp_path)}),
                    "backend 'openvino' cannot train (inference only)",
                    f"trainable backends ({', '.join(backends.trainable())}; their modes")


def test_a_terminal_without_utf8_gets_question_marks_not_a_traceback(tmp_path):
    # `d500 data list` prints '…' for a dataset whose presence is not checked; under LANG=C
    # or PYTHONIOENCODING=ascii rich's write raised UnicodeEncodeError, a traceback, exit 1
    import os
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "D500_HOME": str(tmp_path)}
    env.pop("D500_DATA", None)
    out = d500("data", "list", env=env)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "mnist" in out.stdout and "?" in out.stdout


def test_an_empty_backends_list_is_refused_not_read_as_every_backend():
    """`--backends "$B"` with B unset ran every installed backend (op bench, run, net); now it
    is empty, as ',' was. (--level 9 would stop the run where the check is missing.)"""
    from d500 import backends
    from d500.errors import UsageError
    with pytest.raises(UsageError, match="^--backends is empty$"):
        backends.select("")
    one_line_exit_2(d500("run", "--quick", "--backends", "", "--level", "9"),
                    "d500 run: error: --backends is empty")
