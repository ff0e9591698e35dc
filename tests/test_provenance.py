"""Provenance: hardware, versions without importing frameworks, git state, cached peak FLOP/s."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from d500 import provenance

ROOT = Path(__file__).resolve().parent.parent


def test_collect_describes_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    info = provenance.collect()
    assert info["cpu"]["logical_cores"] == os.cpu_count() and info["cpu"]["model"]
    assert info["memory_bytes"] > 2**26
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(info["gpus"], list)
    for name in ("numpy", "onnx", "d500"):
        assert info["packages"][name] == importlib.metadata.version(name)
    if (ROOT / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", info["git"]["commit"] or "")
        assert info["git"]["dirty"] in (True, False)
    assert info["peak_flops"] > 1e8
    summary = provenance.summary(info)
    assert info["cpu"]["model"] in summary and "numpy" in summary
    assert provenance.digest(info) == provenance.digest(json.loads(json.dumps(info)))


def test_no_framework_is_imported(tmp_path):
    code = ("import sys; from d500 import provenance; info = provenance.collect(); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'onnxruntime', 'mpi4py') "
            "if m in sys.modules)); print(info['packages']['torch'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "D500_HOME": str(tmp_path)}, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    imported, torch_version = out.stdout.splitlines()
    assert imported == "[]"
    try:
        assert torch_version == importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        assert torch_version == "None"


def test_peak_flops_is_measured_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    first = provenance.peak_flops()
    cached = list((tmp_path / "cache" / "provenance").glob("peak_flops-*.json"))
    assert len(cached) == 1
    assert json.loads(cached[0].read_text())["flops"] == first
    cached[0].write_text(json.dumps({"flops": 123.0}))  # the cache, not a new measurement
    assert provenance.peak_flops() == 123.0
    measured = provenance.peak_flops(refresh=True)
    assert measured > 1e8 and json.loads(cached[0].read_text())["flops"] == measured
