"""No level-3 rank rewrites d500's code or its Python: the level-3 judge, rank 0's child, imports
its trainer, data and ledger modules only after the ranks ran the entry's code, so an optimizer
file that appended to d500/training/data/lm.py as it was imported had that same run's judge
evaluate on training windows (its tokens_sha256 check passing), and every later judge too. Each
rank now runs in a mount namespace of its own (where the kernel permits: root) with d500's folder
and sys.prefix read-only (and $D500_HOME covered: test_home_hidden_mpi.py). The attack on real
`mpiexec -n 2` ranks: an optimizer file that, imported in each rank, creates a file in d500's
package folder and in the virtual environment, and records what happened."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import d500
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python"),
              pytest.mark.skipif(not jobs.namespace_permitted(),
                                 reason="no mount namespace permitted here (root's)")]

WRITE = '''
import errno, json, os, sys
import d500
from d500.training.optimizers import Optimizer

for folder in (os.path.dirname(d500.__file__), sys.prefix):
    target = os.path.join(folder, ".rank-wrote-" + str(os.getpid()))
    try:
        open(target, "x").close()
        said = "wrote"
    except OSError as err:
        said = errno.errorcode.get(err.errno, str(err.errno))
    with open(os.environ["D500_WROTE"], "a") as out:
        out.write(json.dumps([os.environ.get("PMI_RANK"), target, said]) + "\\n")


class Write(Optimizer):
    name = "write"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


def test_no_rank_writes_d500s_code_or_its_python(tmp_path):
    said = tmp_path / "wrote.jsonl"
    try:
        out = jobs.attacked(tmp_path, WRITE, "Write", D500_WROTE=str(said))
        found = [json.loads(line) for line in said.read_text().splitlines()]
    finally:  # (before the fix: files in the shared tree and venv, removed again)
        for folder in (Path(d500.__file__).parent, Path(sys.prefix)):
            for planted in folder.glob(".rank-wrote-*"):
                planted.unlink()
    assert out.returncode in (0, 1), out.stderr[-3000:]  # the judge still wrote its run
    ranks = {rank for rank, _, _ in found if rank is not None}
    assert ranks == {"0", "1"}, found  # both ranks imported the file (the probe too, unranked)
    assert [said for *_, said in found if said == "wrote"] == [], found
    assert jobs.last_run(tmp_path / "home")["status"] in ("succeeded", "missed"), out.stderr[-2000:]
