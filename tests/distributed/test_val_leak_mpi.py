"""No level-3 rank learns a figure of the held-out split: the judge's train message carried the
last validation accuracy for rank 0's progress display, and rank 0 relays every command to every
rank, so the entry's code on any rank, reading what it was sent, learned each evaluation's score
on the validation split (enough to select on it). The judge shows the progress now. The attack,
performed on real `mpiexec -n 2` ranks: an optimizer file recording every command its rank is
relayed and every message rank 0 hears from its judge. (Level 2's: tests/training/test_val_leak.py.)
The second attack reads the run's MLLOG, which the judge writes as the run goes, in $D500_HOME:
a rank runs as the judge's user, and read each eval_accuracy line the moment it was written.
"""

from __future__ import annotations

import json

import pytest

from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs
from tests.training.test_mllog_leak import READ

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

LISTEN = '''
import json, os
from multiprocessing import connection
import d500.distributed.loop as _loop
from d500.training.optimizers import Optimizer


def _heard(message):
    if isinstance(message, tuple) and message and isinstance(message[0], str):
        plain = [v for v in message[1:] if isinstance(v, (int, float, str, type(None)))]
        with open(os.environ["D500_HEARD"], "a") as out:
            out.write(json.dumps([os.environ.get("PMI_RANK"), message[0], plain]) + "\\n")
    return message


if not hasattr(_loop, "_heard"):  # (the file may be imported twice)
    _loop._heard = True
    _bcast, _recv = _loop.lazy_bcast, connection.Connection.recv
    _loop.lazy_bcast = lambda mpi, value: _heard(_bcast(mpi, value))  # every rank's commands
    connection.Connection.recv = lambda self: _heard(_recv(self))  # rank 0's judge's words


class Listen(Optimizer):
    name = "listen"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # one real 2-rank job of 3 digits epochs: ~15 s
def test_no_rank_hears_a_validation_figure(tmp_path):
    home, heard = tmp_path / "home", tmp_path / "heard.jsonl"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 3})
    entry = jobs.entry(tmp_path, "sync", folder="listen", files={"opt.py": LISTEN},
                       name="listen", optimizer="opt.py:Listen", hyperparameters={"lr": 0.1},
                       search_space={}, feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0",
                     env=jobs.environment(home, D500_HEARD=str(heard)))
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 1: the target missed
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    vals = {e["metrics"]["val_accuracy"] for e in ledger.evaluations(run["id"])}
    assert len(vals) >= 2, vals
    said = [json.loads(line) for line in heard.read_text().splitlines()]
    trains = {rank: sum(1 for r, what, _ in said if r == rank and what == "train")
              for rank in ("0", "1")}
    assert min(trains.values()) >= 2, trains  # the attack heard every chunk on both ranks
    # the run's own figures come back with its result, once it ended (its published line)
    learned = [(rank, what, v) for rank, what, plain in said if what != "result"
               for v in plain if isinstance(v, float) and v in vals]
    assert learned == [], learned  # (before: every rank, each train after an evaluation)
    assert "val acc" in out.stderr  # the judge shows the validation accuracy in its progress


# At every 10th step, each rank reads every MLLOG under $D500_HOME (where the judge writes the
# run's, line by line) for the validation accuracies logged so far: level 2's attack file, READ


@pytest.mark.slow  # one real 2-rank job of 3 digits epochs: ~15 s
def test_no_rank_reads_a_validation_figure_in_the_live_mllog(tmp_path):
    home, read = tmp_path / "home", tmp_path / "read.jsonl"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 3})
    entry = jobs.entry(tmp_path, "sync", folder="read", files={"opt.py": READ}, name="read",
                       optimizer="opt.py:Read", hyperparameters={"lr": 0.1}, search_space={},
                       feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0",
                     env=jobs.environment(home, D500_READ=str(read)))
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 1: the target missed
    looks = [json.loads(line) for line in read.read_text().splitlines()]
    assert {rank for rank, _, _ in looks} == {"0", "1"}  # each rank looked (where the kernel
    # permits, it finds no MLLOG at all: $D500_HOME is covered, d500.distributed.cover)
    seen = [v for _, _, values in looks for v in values]
    assert seen == [], seen  # (before: 0.807 from the 2nd epoch on, then 0.867, on both ranks)
    (run,) = Ledger(home / "ledger.sqlite").runs()  # all of them in the MLLOG once it ended
    log = (home / "runs" / str(run["id"]) / "mllog.txt").read_text()
    assert log.count('"key": "eval_accuracy"') == 3, log
