"""The package works installed: build the wheel, install it into a fresh venv that sees the
project venv's dependencies (not its d500), and run level 0, level 1 and `d500 run` from a
directory outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import onnx
import pytest

from d500.builders import build

ROOT = Path(__file__).resolve().parent.parent

MY_OP = '''
"""A user's own operator, outside any checkout."""
import numpy as np
from d500.operators import CustomOperator


class MyRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.maximum(x, 0)

    def backward(self, grad_outputs, inputs, outputs):
        return (grad_outputs[0] * (inputs[0] > 0),)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv's bin folder, with the freshly built wheel installed (no dependencies: those
    come from the project venv, through a .pth line that adds its site-packages after ours)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", str(ROOT), "-w", str(tmp / "dist")], check=True, cwd=tmp,
                   capture_output=True)
    wheel = next((tmp / "dist").glob("d500-*.whl"))
    venv.create(tmp / "venv", with_pip=False)
    py = tmp / "venv" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True
                          ).stdout.strip()
    Path(site, "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "-q", str(wheel)], check=True, capture_output=True, cwd=tmp)
    return tmp / "venv" / "bin"


def run(bin_: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(D500_HOME=str(cwd / "results"), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([str(bin_ / "d500"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_the_installed_wheel_works_from_any_directory(installed, tmp_path):
    where = subprocess.run([str(installed / "python"), "-c", "import d500, d500.paths; "
                            "print(d500.__file__); print(d500.paths.rulebook())"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert str(ROOT) not in where, where  # the wheel's copy, not the checkout
    corpus = subprocess.run([str(installed / "python"), "-c", "from d500.training.data import "
                             "text; print(len(text.documents()), text.path())"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert corpus.startswith("168 ") and str(ROOT) not in corpus  # text-lm's corpus, checked
    (tmp_path / "my_op.py").write_text(textwrap.dedent(MY_OP))

    result = run(installed, tmp_path, "op", "validate", "my_op.py:MyRelu", "--input-shape", "4,64")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: PASS" in result.stdout

    (tmp_path / "models").mkdir()
    onnx.save(build("mlp", input_shape=(1, 8, 8), seed=0, loss=True),
              tmp_path / "models" / "mlp.onnx")
    result = run(installed, tmp_path, "net", "check", "models/mlp.onnx",
                 "--backends", "reference,onnxruntime")
    assert result.returncode == 0, result.stdout + result.stderr

    (tmp_path / "mine.yaml").write_text(textwrap.dedent("""\
        name: my-mlp
        level: 1
        model: {file: models/mlp.onnx, loss: loss}
        batch_size: 4
        train: false
        budget: 0.1
        metrics: [latency, agreement]
        """))
    result = run(installed, tmp_path, "net", "bench", "mine.yaml",
                 "--backends", "reference,onnxruntime", "--budget", "0.05")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "my-mlp" in result.stdout

    result = run(installed, tmp_path, "run", "--quick", "--level", "0,1", "--workload",
                 "gemm-small", "--workload", "mlp-mnist", "--backends", "reference,onnxruntime",
                 "--no-html", "--quiet-wait", "0")  # the wait: tests/test_provenance.py
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs recorded" in result.stdout
    assert not (tmp_path / "levels").exists() and (tmp_path / "results" / "ledger.sqlite").is_file()
