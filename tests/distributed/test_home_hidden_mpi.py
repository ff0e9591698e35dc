"""No level-3 rank reads the judge's files in $D500_HOME nor writes a cache its judge reads: each
rank's entry code sees the results directory covered as a level-2 worker does (only the entries'
cache, writable, and the entry's own folder), while rank 0's judges, started outside the cover,
write the ledger, the MLLOG and checkpoints there (d500.distributed.cover). The attack on real
`mpiexec -n 2` ranks, a tiny text-lm whose workload records no tokens_sha256 (so its judge
trusts the token cache as it lies on disk): an optimizer file that, as each rank imports it and
again at its first step (the run's rows and MLLOG written by then), reads every file of
$D500_HOME outside the entries' cache, and the ledger through /proc/PID/root of every process of
the job (its judges and their helper: started outside the cover), looks for a descriptor left
open on one, plants a file, and rewrites the token cache with zeros, which, read by the judge,
had it train and evaluate on a constant sequence: validation log-perplexity near 0."""

from __future__ import annotations

import json
import math

import pytest

from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python"),
              pytest.mark.skipif(not jobs.namespace_permitted(),
                                 reason="no mount namespace permitted here (root's)")]

ATTACK = '''
import glob, json, os
import numpy as np
from d500.training.optimizers import Optimizer

HOME = os.path.realpath(os.environ["D500_HOME"])
ENTRIES = os.path.join(HOME, "cache", "entries")


def _theirs(path):
    return path.startswith(HOME + os.sep) and not path.startswith(ENTRIES + os.sep)


def _try(when):
    read, wrote, fds = [], [], []
    for folder, _, files in os.walk(HOME):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    f.read(1)
                if _theirs(path):
                    read.append(os.path.relpath(path, HOME))
            except OSError:
                pass
    try:
        open(os.path.join(HOME, "planted-" + str(os.getpid())), "x").close()
        wrote.append("planted")
    except OSError:
        pass
    for path in glob.glob(os.path.join(HOME, "cache", "text", "*.npz")):
        try:
            with np.load(path) as data:
                sizes = {k: len(data[k]) for k in data.files}
            np.savez(path + ".tmp.npz", **{k: np.zeros(n, np.int32) for k, n in sizes.items()})
            os.replace(path + ".tmp.npz", path)
            wrote.append(os.path.relpath(path, HOME))
        except OSError:
            pass
    mine = ("D500_HOME=" + os.environ["D500_HOME"]).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):  # this job's processes' views
        try:
            with open("/proc/" + pid + "/root" + HOME + "/ledger.sqlite", "rb") as f:
                f.read(1)
            with open("/proc/" + pid + "/environ", "rb") as f:
                if mine in f.read().split(b"\\0"):
                    read.append("/proc/" + pid + "/root")
        except OSError:
            pass
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if _theirs(target):
            fds.append(target)
    with open(os.environ["D500_TRIED"], "a") as out:
        out.write(json.dumps({"rank": os.environ.get("PMI_RANK"), "when": when, "read": read,
                              "wrote": wrote, "fds": fds}) + "\\n")


_try("import")


class Poison(Optimizer):
    name = "poison"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1:
            _try("step")
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # one real 2-rank job of one tiny text-lm epoch: ~20 s
def test_no_rank_reads_the_judges_files_nor_poisons_its_token_cache(tmp_path):
    home, tried = tmp_path / "home", tmp_path / "tried.jsonl"
    wl = jobs.workload(
        tmp_path, "text-lm", budget={"max_epochs": 1, "max_seconds": 300},
        model={"builder": "transformer", "layers": 1, "width": 16, "heads": 2, "tied": True},
        dataset={"name": "python-stdlib", "train": 6, "validation": 2, "test": 2,
                 "split_seed": 3, "context": 16, "vocab": 300, "tokens_sha256": None},
        evaluation={"every_steps": 5}, target={"metric": "val_log_perplexity", "value": 1.0})
    entry = jobs.entry(tmp_path, "sync-adamw", folder="attack", files={"opt.py": ATTACK},
                       name="attack", optimizer="opt.py:Poison", hyperparameters={"lr": 0.05},
                       search_space={}, feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0",
                     env=jobs.environment(home, D500_TRIED=str(tried)))
    assert out.returncode in (0, 1), out.stderr[-3000:]
    found = [json.loads(line) for line in tried.read_text().splitlines()]
    ranked = {(t["rank"], t["when"]) for t in found if t["rank"] is not None}
    assert ranked == {(r, w) for r in ("0", "1") for w in ("import", "step")}, found
    assert [t for t in found if t["read"] or t["wrote"] or t["fds"]] == [], found
    run = jobs.last_run(home)
    assert run["status"] == "missed", (run["status"], run["error"])
    # the judge trained and evaluated on the real tokens (4.70 after its epoch; on zeros, 0.67)
    assert run["figures"]["val_log_perplexity"] > math.log(300) - 2, run["figures"]
