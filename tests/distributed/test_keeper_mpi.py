"""A rank runs as the same user as the d500 processes that keep it (d500.children.keep: its
waiter and keeper), in no PID namespace of its own (MPI reads its peers by pid), so the kernel
lets it signal them; on real `mpiexec -n 2` ranks under `-disable-auto-cleanup` (as `d500 run`
launches). Rank 1 leaves a process behind (a double fork, as a daemon does), stops its keeper
and kills its waiter: its processes would hang below a stopped keeper that the launcher no
longer knows, outside the job's tree, where the judge's hold would not stop them while its clock
is paused, its CPU reading would count them as others' load, and nothing would end them with
the job (before: the run was recorded, and the process outlived the job). It also tries its
process group, rank 0's keeper and an RLIMIT_CPU on its keeper. Each rank's seccomp filter
(d500.distributed.guard) refuses every one (EPERM); the run goes on, and nothing outlives the
job. (Were one to get through, the judge would find the keeper stopped or the waiter gone at
its next hold, record the run failed and end what left the tree: tests/distributed/
test_guard.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs
from tests.distributed.test_isolation_mpi import _running

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

ESCAPE = '''
import json, os, resource, signal, time
from d500.training.optimizers import Optimizer


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _try(call):
    try:
        call()
        return "done"
    except PermissionError:
        return "EPERM"


class Escape(Optimizer):
    name = "escape"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1 and os.environ.get("PMI_RANK") == "1":
            if os.fork() == 0:  # a process left behind, in a session of its own
                os.setsid()
                if os.fork() == 0:
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    with open(os.environ["D500_LEFT"], "a") as out:
                        out.write(f"{os.getpid()}\\n")
                    time.sleep(600)
                os._exit(0)
            keeper = os.getppid()
            waiter = _parent(keeper)
            other = [_children(w)[0] for w in _children(_parent(waiter)) if w != waiter]
            tried = {  # the harmless ones first: a signal that changes nothing, a limit read
                "group": _try(lambda: os.kill(0, signal.SIGCONT)),
                "rank 0's keeper": _try(lambda: os.kill(other[0], signal.SIGCONT)),
                "keeper's RLIMIT_CPU": _try(lambda: resource.prlimit(keeper,
                                                                     resource.RLIMIT_CPU)),
                "stop keeper": _try(lambda: os.kill(keeper, signal.SIGSTOP)),
                "kill waiter": _try(lambda: os.kill(waiter, signal.SIGKILL)),
            }
            with open(os.environ["D500_TRIED"], "w") as out:
                json.dump(tried, out)
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # one real 2-rank job of one epoch: ~10 s, 17 s at load 10
def test_a_rank_cannot_stop_its_keeper_nor_kill_its_waiter(tmp_path):
    left, tried = tmp_path / "left.txt", tmp_path / "tried.json"
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 1})
    entry = jobs.entry(tmp_path, "sync", folder="attack", files={"opt.py": ESCAPE},
                       name="escape", optimizer="opt.py:Escape", hyperparameters={"lr": 0.1},
                       search_space={}, feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0",
                     launcher_options=("-disable-auto-cleanup",),
                     env=jobs.environment(home, D500_LEFT=str(left), D500_TRIED=str(tried)))
    pids = [int(p) for p in left.read_text().split()] if left.exists() else []
    try:
        assert pids, out.stderr
        assert json.loads(tried.read_text()) == {
            "group": "EPERM", "rank 0's keeper": "EPERM", "keeper's RLIMIT_CPU": "EPERM",
            "stop keeper": "EPERM", "kill waiter": "EPERM"}
        assert out.returncode in (0, 1), out.stderr  # 1: the target missed in one epoch
        (run,) = Ledger(home / "ledger.sqlite").runs()
        assert run["status"] in ("succeeded", "missed"), (run["status"], run["error"])
        deadline = time.monotonic() + 5
        while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive, f"process(es) {alive} outlived the job"
    finally:
        for pid in pids + _of_job(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _of_job(home: Path) -> list[int]:
    """The processes left of the job whose D500_HOME is `home` (a stopped keeper, its rank)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and f"D500_HOME={home}\0".encode() in \
                    (proc / "environ").read_bytes() + b"\0":
                found.append(int(proc.name))
    return found
