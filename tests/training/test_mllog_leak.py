"""The worker reads no figure of the held-out split in the run's MLLOG: the judge writes the log
as the run goes, in $D500_HOME, which the worker could read (its mount namespace made it
read-only, not hidden), so the entry's code read each evaluation's validation accuracy the
moment it was logged. The judge keeps those lines in memory until the run ends
(MLLogger.withhold), and the worker's mount namespace now hides $D500_HOME but its own cache
(d500.children.keep: tests/training/test_home_hidden.py), so it finds no MLLOG at all there;
where the kernel refuses namespaces it finds the log, without those lines. The attack,
performed: an optimizer reading every MLLOG it can find. (Level 3's, whose ranks are in no
namespace: tests/distributed/test_val_leak_mpi.py.)"""

from __future__ import annotations

import json

import pytest

from d500.ledger import Ledger

from . import entries

# the attack's optimizer file (level 3's ranks run it too: tests/distributed/test_val_leak_mpi.py);
# each look records [its MPI rank or None, the logs found, the accuracies read]
READ = '''
import glob, json, os
from d500.training.optimizers import Optimizer


class Read(Optimizer):
    name = "read"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) % 10 == 0:
            logs = glob.glob(os.path.join(os.environ["D500_HOME"], "**", "mllog*"),
                             recursive=True)
            seen = []
            for path in logs:
                with open(path) as f:
                    seen += [json.loads(line.split(" ", 1)[1])["value"] for line in f
                             if '"eval_accuracy"' in line]
            with open(os.environ["D500_READ"], "a") as out:
                out.write(json.dumps([os.environ.get("PMI_RANK"), len(logs), seen]) + "\\n")
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run of 3 epochs, ~10 s)
def test_the_worker_reads_no_validation_figure_in_the_live_mllog(home, tmp_path, monkeypatch):
    read = tmp_path / "read.jsonl"
    monkeypatch.setenv("D500_READ", str(read))
    ledger = Ledger()
    result = entries.run(entries.entry(tmp_path, READ, "Read", name="read"), epochs=3,
                         ledger=ledger)
    assert result.status in ("succeeded", "missed"), result.error
    looks = [json.loads(line) for line in read.read_text().splitlines()]
    assert looks, "the optimizer never looked"
    seen = [v for _, _, values in looks for v in values]
    assert seen == [], seen  # (before: 0.807 from the 2nd epoch on, then 0.867)
    log = ledger.resolve_path(ledger.get(result.run_id)["mllog"]).read_text()
    assert log.count('"key": "eval_accuracy"') == 3, log  # all of them once the run ended
