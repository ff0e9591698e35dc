"""The `d500` command: instant help, one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
import time


def d500(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_help_is_instant_and_imports_no_framework():
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c",
                          "import sys; from d500.cli import main; main(['--help']); "
                          "print(sorted(m for m in ('torch','tensorflow','onnxruntime') "
                          "if m in sys.modules))"], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0
    assert "conformance" in out.stdout
    assert out.stdout.strip().endswith("[]")
    assert elapsed < 1.0, elapsed


def test_unknown_backend_is_one_line_exit_2():
    out = d500("conformance", "--backend", "nosuch")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "nosuch" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_command():
    out = d500("frobnicate")
    assert out.returncode == 2 and "frobnicate" in out.stderr
