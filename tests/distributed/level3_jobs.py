"""Helpers of the level-3 tests: real `mpiexec -n N d500 train` jobs in a fresh $D500_HOME, copies
of the rulebook's workloads and entries with some fields changed, the process of one rank."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from d500.distributed import launch
from d500.distributed.launcher import mpiexec, train_argv
from tests.helpers import seed_peak

ROOT = Path(__file__).resolve().parents[2]
LEVEL3 = ROOT / "levels" / "3-distributed"
ENTRIES = ROOT / "submissions"
MPIEXEC = mpiexec()


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, with D500_HOME and `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in launch.LAUNCHER_VARIABLES and not k.startswith(("PMI_", "MPI_", "HYDRA"))}
    env.update(D500_HOME=str(home), **extra)
    seed_peak(home)  # the session's peak FLOP/s, not measured again in every fresh home
    return env


def workload(tmp: Path, source: str, **changes: Any) -> Path:
    """A copy of levels/3-distributed/SOURCE.yaml with top-level fields changed (nested mappings
    merged one level deep), in `tmp`."""
    data = yaml.safe_load((LEVEL3 / f"{source}.yaml").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp / f"{source}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def entry(tmp: Path, source: str, folder: str | None = None,
          files: dict[str, str] | None = None, **changes: Any) -> Path:
    """A copy of submissions/SOURCE with fields changed (and extra files), in tmp/FOLDER."""
    data = yaml.safe_load((ENTRIES / source / "submission.yaml").read_text())
    data.update(changes)
    out = tmp / (folder or source)
    out.mkdir(parents=True, exist_ok=True)
    (out / "submission.yaml").write_text(yaml.safe_dump(data))
    for file, text in (files or {}).items():
        (out / file).write_text(text)
    return out


def train(home: Path, ranks: int, workload_path: Path | str, submission: Path | str, *extra: str,
          launcher_options: tuple[str, ...] = (), timeout: float = 240,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS d500 train WORKLOAD --submission DIR --json` to its end."""
    argv = train_argv(workload_path, submission, ranks, extra=extra,
                      launcher_options=launcher_options)
    return subprocess.run(argv, env=env or environment(home), cwd=home.parent,
                          capture_output=True, text=True, timeout=timeout, check=False)


def last_run(home: Path) -> dict[str, Any]:
    """The newest level-3 run in the ledger of `home`."""
    from d500.ledger import Ledger
    return Ledger(home / "ledger.sqlite").runs(level=3)[-1]


def judged(tmp: Path, submission: Path | str, epochs: int = 2
           ) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """`mpiexec -n 2 d500 train` of digits-mlp (at most `epochs` epochs, its copy in `tmp`) by
    the entry `submission` at seed 0 in tmp/home, and the run its judge recorded."""
    home = tmp / "home"
    wl = workload(tmp, "digits-mlp", budget={"max_epochs": epochs})
    out = train(home, 2, wl, submission, "--seed", "0")
    return out, last_run(home)


def attacked(tmp: Path, code: str, cls: str, **env: str) -> subprocess.CompletedProcess:
    """`mpiexec -n 2 d500 train` of digits-mlp (one epoch, its copy in `tmp`) at seed 0 in
    tmp/home by a copy of the sync entry whose optimizer is class `cls` of opt.py, `code`; `env`:
    the variables that code reads (where it writes what it found)."""
    home = tmp / "home"
    wl = workload(tmp, "digits-mlp", budget={"max_epochs": 1})
    entry_dir = entry(tmp, "sync", folder="attack", files={"opt.py": code}, name="attack",
                      optimizer=f"opt.py:{cls}", hyperparameters={"lr": 0.1}, search_space={},
                      feasible_points=[])
    return train(home, 2, wl, entry_dir, "--seed", "0", env=environment(home, **env))


def caught(tmp: Path, source: str, name: str, code: str) -> dict[str, Any]:
    """The run of a copy of entry `source` whose optimizer file `name`.py (class Sgd) is `code`,
    which cheats on import in every rank, asserted recorded failed by the judge's audit."""
    entry_dir = entry(tmp, source, folder=name, files={f"{name}.py": code}, name=name,
                      optimizer=f"{name}.py:Sgd", hyperparameters={"lr": 0.1})
    out, run = judged(tmp, entry_dir)
    assert out.returncode != 0
    assert run["status"] == "failed", (run["status"], run["error"])
    assert "audit:" in run["error"], run["error"]
    return run


def plain_d500(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`d500 ARGS` in a plain process (no launcher)."""
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], env=environment(home),
                          cwd=home.parent, capture_output=True, text=True, timeout=timeout,
                          check=False)


def rank_process(home: Path, rank: int) -> int | None:
    """The pid of the d500 process of `rank` in a job whose D500_HOME is `home`: the kept one,
    below its keeper and the process mpiexec's proxy waits on (d500.children.keep: forks, with
    the same environment and command line; so is its helper below it, rank 0's while its judges
    live, d500.distributed.cover), or the lowest of those while it has not split."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if (f"D500_HOME={home}".encode() in env and f"PMI_RANK={rank}".encode() in env
                and b"d500.cli" in cmdline):
            found[int(proc.name)] = parent
    def depth(pid: int) -> int:  # how many of the found processes lie above it
        return 0 if found[pid] not in found else 1 + depth(found[pid])

    kept = [pid for pid in found if depth(pid) == 2]
    return (sorted(kept) or sorted(found, key=depth, reverse=True) or [None])[0]


def settled(home: Path, run: int, seconds: float) -> dict[str, Any]:
    """A killed job's run row once it has left `running`, or as it is after `seconds`: the
    rank that wrote it (rank 0's judge) may end a moment after its ranks seem gone (aborted by
    MPICH, or exiting: its /proc environ already empty), and the row reads `running` until then."""
    from d500.ledger import Ledger
    ledger, deadline = Ledger(home / "ledger.sqlite"), time.monotonic() + seconds
    while ledger.get(run)["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    return ledger.get(run)


def namespace_permitted() -> bool:
    """Whether this kernel lets a process of this user unshare a mount namespace (root's)."""
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x20000) != 0)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0
