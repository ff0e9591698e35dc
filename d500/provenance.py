"""Where and with what a run ran: hardware, OS, package versions, git state, measured peak FLOP/s.

No framework is imported: versions come from importlib.metadata, the MPI library's from
`mpichversion`/`ompi_info`. The peak is a short calibrated float32 GEMM, cached per machine.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from d500.paths import PROJECT_ROOT, cache

PACKAGES = ("d500", "torch", "tensorflow", "tensorflow-cpu", "onnx", "onnxruntime", "numpy",
            "mpi4py", "mpich")
_collected: dict[str, Any] | None = None
_peak_memo: dict[str, float] = {}  # machine id -> FLOP/s measured by this process


def collect(refresh: bool = False) -> dict[str, Any]:
    """Everything that identifies the environment of a run (memoised per process)."""
    global _collected
    if _collected is None or refresh:
        _collected = {
            "host": socket.gethostname(),
            "cpu": cpu(),
            "memory_bytes": memory_bytes(),
            "gpus": gpus(),
            "os": f"{platform.system()} {platform.release()}",
            "platform": platform.platform(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "packages": versions(),
            "mpi_library": mpi_library(),
            "git": git(),
        }
    result = json.loads(json.dumps(_collected))
    result["peak_flops"] = peak_flops()
    result["peak_flops_method"] = "float32 GEMM (numpy), fastest of 7 timed products"
    return result


def digest(provenance: dict[str, Any]) -> str:
    """A stable sha256 of a provenance dict (canonical JSON)."""
    return hashlib.sha256(json.dumps(provenance, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def summary(provenance: dict[str, Any]) -> str:
    """One line: machine and the versions that matter, for leaderboards and listings."""
    cpu_info = provenance.get("cpu", {})
    gib = (provenance.get("memory_bytes") or 0) / 2**30
    gpu = ", ".join(g.get("name", "?") for g in provenance.get("gpus") or []) or "no GPU"
    pk = provenance.get("packages", {})
    vers = ", ".join(f"{k} {pk[k]}" for k in ("torch", "tensorflow", "tensorflow-cpu",
                                               "onnxruntime", "numpy") if pk.get(k))
    peak = provenance.get("peak_flops")
    peak_txt = f", peak {peak / 1e9:.0f} GFLOP/s" if peak else ""
    git_info = provenance.get("git") or {}
    commit = (git_info.get("commit") or "")[:10]
    dirty = "+dirty" if git_info.get("dirty") else ""
    return (f"{cpu_info.get('model', '?')} ×{cpu_info.get('logical_cores', '?')}, {gib:.0f} GiB,"
            f" {gpu}{peak_txt}; {provenance.get('os', '?')}, Python {provenance.get('python')}"
            f"; {vers}" + (f"; git {commit}{dirty}" if commit else ""))


def cpu() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    physical: set[tuple[str, str]] = set()
    try:
        phys_id = "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                model = value
            elif key == "physical id":
                phys_id = value
            elif key == "core id":
                physical.add((phys_id, value))
    except OSError:
        pass
    if sys.platform == "darwin":
        model = _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or model
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"model": model, "logical_cores": os.cpu_count(), "physical_cores":
            len(physical) or None, "usable_cores": affinity}


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpus() -> list[dict[str, str]]:
    """NVIDIA GPUs via nvidia-smi when it is installed; an empty list otherwise."""
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader"])
    found = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return found


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that matter, without importing them."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def mpi_library() -> str | None:
    """The MPI library's version line (MPICH's `mpichversion` or Open MPI's `ompi_info`)."""
    bindir = Path(sys.executable).parent
    for tool, args in (("mpichversion", []), ("ompi_info", ["--version"])):
        exe = bindir / tool if (bindir / tool).exists() else shutil.which(tool)
        if exe:
            out = _run([str(exe), *args])
            if out:
                lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
                version = next((ln for ln in lines if "version" in ln.lower()), lines[0])
                return " ".join(version.split())
    return None


def git() -> dict[str, Any]:
    """The commit of the d500 tree and whether it has uncommitted changes."""
    if not (PROJECT_ROOT / ".git").exists() or not shutil.which("git"):
        return {"commit": None, "dirty": None}
    commit = _run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"])
    status = _run(["git", "-C", str(PROJECT_ROOT), "status", "--porcelain",
                   "--untracked-files=no"])
    return {"commit": commit.strip() if commit else None,
            "dirty": None if status is None else bool(status.strip())}


def machine_id() -> str:
    """What identifies the machine for the peak-FLOP/s cache."""
    info = cpu()
    raw = json.dumps([socket.gethostname(), info["model"], info["logical_cores"],
                      info["usable_cores"], platform.machine(), versions().get("numpy")])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def peak_flops(refresh: bool = False) -> float:
    """Measured float32 GEMM FLOP/s of this machine: calibrated so one product takes ~50 ms,
    the fastest of 7 timed products after warm-up (a peak is an upper bound: a low estimate would
    flatter every peak_fraction). Cached per machine under D500_HOME/cache."""
    path = cache("provenance") / f"peak_flops-{machine_id()}.json"  # per machine
    if not refresh and path.is_file():
        try:
            return float(json.loads(path.read_text())["flops"])
        except (ValueError, KeyError, OSError):
            pass
    key = machine_id()
    flops = _peak_memo[key] if key in _peak_memo and not refresh else _measure_gemm()
    _peak_memo[key] = flops
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"flops": flops, "measured": time.time(), "dtype": "float32"}))
    os.replace(tmp, path)
    return flops


def _measure_gemm() -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    n = 512
    while True:  # grow until one product takes ~50 ms (or n hits the cap)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        a @ b
        t0 = time.perf_counter()
        a @ b
        elapsed = time.perf_counter() - t0
        if elapsed > 0.05 or n >= 4096:
            break
        n *= 2
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / min(times)


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None
