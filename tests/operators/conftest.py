"""Level-0 test helpers: a fresh D500_HOME per test, the example operators, the CLI as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from d500.operators.base import load_class
from d500.operators.workloads import LEVEL_DIR, load_case

ROOT = Path(__file__).resolve().parents[2]
OPS = Path(__file__).resolve().parent / "ops"
SUBMISSIONS = ROOT / "submissions"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def op(file: str, name: str):
    """A test operator class from tests/operators/ops/FILE."""
    return load_class(OPS / file, name).cls


def case(name: str):
    return load_case(LEVEL_DIR / f"{name}.yaml")


def d500(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "d500.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
