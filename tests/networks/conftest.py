"""Level-1 test helpers: a fresh D500_HOME per test, builder models on disk, the CLI as process."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from d500 import backends
from d500.backends.onnxruntime import OnnxRuntimeBackend
from d500.backends.reference import ReferenceBackend
from d500.errors import UnsupportedOperator

ROOT = Path(__file__).resolve().parents[2]
LEVEL1 = ROOT / "levels" / "1-networks"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return tmp_path / "home"


def save_builder(tmp_path: Path, name: str, shape=(1, 28, 28), loss: bool = False,
                 classes: int = 10) -> Path:
    from d500 import builders
    path = tmp_path / f"{name}{'-loss' if loss else ''}.onnx"
    onnx.save(builders.build(name, shape, classes=classes, loss=loss), path)
    return path


def d500(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *map(str, args)], check=False,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


class _Perturbed:
    """Executable wrapper: onnxruntime's outputs, 1% of the scale off in one element."""

    def __init__(self, exe):
        self.exe = exe

    def __getattr__(self, name):
        return getattr(self.exe, name)

    def run(self, feeds):
        outs = [np.array(o) for o in self.exe.run(feeds)]
        outs[0].flat[0] += 0.01 * np.abs(outs[0]).max()
        return outs


class PerturbedBackend(OnnxRuntimeBackend):
    name = "perturbed"

    @classmethod
    def _prepare(cls, model, device, **kwargs):
        return _Perturbed(super()._prepare(model, device))


class NoReference(ReferenceBackend):
    @classmethod
    def _prepare(cls, model, device, **kwargs):
        node = model.graph.node[0]
        raise UnsupportedOperator(node.op_type, node.domain, 17, node.name, "reference")


@pytest.fixture
def extra_backends(monkeypatch):
    module = types.ModuleType("d500_test_network_backends")
    module.PerturbedBackend, module.NoReference = PerturbedBackend, NoReference
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(backends.BUILTIN, "perturbed", f"{module.__name__}:PerturbedBackend")
    return module
