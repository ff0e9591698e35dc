"""Where level 3's judge pauses its clock to measure test accuracy (kept models over
d500.training.heldout.LIMIT, or before a checkpoint; by default it measures them after the run),
every rank's processes are stopped meanwhile (d500.distributed.jobtree), on real `mpiexec -n 2`
ranks: a thread the entry starts on each rank, computing without pause, does nothing while the
clock is paused, and runs on after. The judge's test evaluations are timed from inside the judge
process by a sitecustomize (the judge is spawned by rank 0: no test can patch it in place), which
also makes the first one last longer than the ranks' watchdogs' silence limit: ranks stopped
together are not given up. (Level 2's twin: tests/training/test_paused_clock.py.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python"),
              pytest.mark.skipif(sys.platform != "linux", reason="one monotonic clock")]

PAUSE = 3.0  # seconds the judge's first test evaluation lasts, over the watchdogs' limit
LIMIT = 2.0  # D500_MPI_TIMEOUT

# In the judge process only (a spawned child of rank 0): each test evaluation (every second
# call of the accuracy measure) timed into $D500_PAUSED, the first one PAUSE s longer
HOOK = f'''
import sys
if "--multiprocessing-fork" in sys.argv:
    import importlib.abc, importlib.util, json, os, time

    def _patch(trainer):
        from d500.training import heldout
        heldout.LIMIT = 0  # every test accuracy at once, the clock paused (by default: after)
        measure, calls = trainer.QUALITY["accuracy"], []

        def timed(predict, x, y):
            t = time.perf_counter()
            value = measure(predict, x, y)
            calls.append(t)
            if len(calls) % 2 == 0:
                if len(calls) == 2:
                    time.sleep({PAUSE})
                with open(os.environ["D500_PAUSED"], "a") as out:
                    out.write(json.dumps([t, time.perf_counter()]) + "\\n")
            return value
        trainer.QUALITY["accuracy"] = timed

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "d500.training.trainer":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
'''

# From its first update on, a thread on each rank computes without pause and appends the times
# it ran (every ~1 ms) to $D500_BUSY.RANK
BUSY = '''
import os, threading, time
import numpy as np
from d500.training.optimizers import Optimizer

_started = []


def _busy(path):
    a, last, seen = np.ones((16, 16)), 0.0, []
    with open(path, "a") as out:
        while True:
            a = a @ a / 16  # a stand-in for extra steps on cached batches
            time.sleep(1e-3)
            now = time.perf_counter()
            seen.append(now)
            if now - last >= 0.005:
                out.write("".join(f"{s}\\n" for s in seen))
                out.flush()
                seen, last = [], now


class Busy(Optimizer):
    name = "busy"

    def update(self, ops, params, grads, state, lr, t):
        if not _started and int(t) == 1:
            path = os.environ["D500_BUSY"] + "." + os.environ["PMI_RANK"]
            _started.append(threading.Thread(target=_busy, args=(path,), daemon=True).start())
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # one real 2-rank job of one epoch, its test evaluation 3 s long: ~10 s
def test_no_rank_computes_while_the_judges_clock_is_paused(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK)
    busy, paused = tmp_path / "busy", tmp_path / "paused.jsonl"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    out = jobs.attacked(tmp_path, BUSY, "Busy", D500_BUSY=str(busy), D500_PAUSED=str(paused),
                        PYTHONPATH=path, D500_MPI_TIMEOUT=str(LIMIT))
    assert out.returncode in (0, 1), out.stderr  # 1: the target missed in one epoch
    (run,) = Ledger(tmp_path / "home" / "ledger.sqlite").runs()
    assert run["status"] in ("succeeded", "missed"), run["error"]
    windows = [json.loads(line) for line in paused.read_text().splitlines()]
    assert windows and windows[0][1] - windows[0][0] >= PAUSE
    for rank in (0, 1):
        seen = [float(s) for s in Path(f"{busy}.{rank}").read_text().split()]
        assert seen, f"rank {rank}'s thread never ran"
        during = [s for s in seen if any(a <= s <= b for a, b in windows)]
        assert not during, (f"rank {rank}'s thread ran {len(during)} times while the judge's "
                            f"clock was paused ({windows})")
        assert max(seen) > windows[0][1], f"rank {rank}'s thread never ran again"
