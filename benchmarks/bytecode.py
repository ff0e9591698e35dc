"""What d500's own bytecode saves each process the test suite starts (tests/conftest.py
compiles it before the first test).

A level-3 rank's d500 imports read from source (a copy of d500 without .pyc, as an editable
install is left where PYTHONDONTWRITEBYTECODE is set) against read from .pyc (a copy compiled
first), interleaved in one run: the CPU seconds each child process spends importing d500's
modules, its frameworks (torch, NumPy, ONNX) imported before the clock starts; `d500 --help`'s
import (d500.cli) likewise.

    .venv/bin/python benchmarks/bytecode.py [--pairs 8]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {  # what a process imports: `d500 --help`, and a level-3 rank (judge and trainer)
    "cli": ["d500.cli"],
    "rank": ["d500.cli", "d500.distributed.judge", "d500.distributed.trainer",
             "d500.training.trainer", "d500.training.resume", "d500.training.worker",
             "d500.backends.torch.executable", "d500.ledger"],
}


def cpu(folder: Path, modules: list[str]) -> float:
    """CPU seconds a fresh interpreter spends importing `modules` from the d500 copy in
    `folder`, after torch, NumPy and ONNX."""
    code = ("import time, numpy, onnx, torch\nt = time.process_time()\n"
            f"import {', '.join(modules)}, d500\nprint(time.process_time() - t)\n"
            f"assert d500.__file__.startswith({str(folder)!r}), d500.__file__")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(folder)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=folder, check=True,
                         capture_output=True, text=True)
    return float(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8, help="processes per variant and import set")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="d500-bytecode-") as tmp:
        source, compiled = Path(tmp, "source"), Path(tmp, "compiled")
        for folder in (source, compiled):
            shutil.copytree(ROOT / "d500", folder / "d500",
                            ignore=shutil.ignore_patterns("__pycache__"))
        compileall.compile_dir(compiled / "d500", quiet=1)
        print(f"load {os.getloadavg()[0]:.2f} at the start", flush=True)
        for name, modules in SETS.items():
            times: dict[str, list[float]] = {"source": [], "compiled": []}
            for _ in range(args.pairs):
                times["source"].append(cpu(source, modules))
                times["compiled"].append(cpu(compiled, modules))
            a, b = (statistics.median(times[k]) for k in ("source", "compiled"))
            print(f"{name:5s} from source {a:.3f} s CPU, from .pyc {b:.3f} s (median of "
                  f"{args.pairs} each): {a - b:.3f} s saved a process, ratio {b / a:.3f}",
                  flush=True)
        print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
