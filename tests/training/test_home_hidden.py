"""The entry's code reads nothing of the results directory ($D500_HOME) but its own cache: its
mount namespace made the folder read-only, not hidden, so an optimizer could copy the ledger
(a run checkpointing every epoch records its evaluations there as it goes: the validation
accuracy so far), read the checkpoints' judge figures, other runs' rows and MLLOGs, and list
it all. The attack, performed in a real run: an optimizer that lists $D500_HOME, reads the
ledger's files, opens a copy of them with sqlite3 for the evaluations, and reads every file it
finds under the folder. Its own file lies there too, as `d500 reproduce` writes an entry's files
(the one folder of the results directory it reads, but its cache). (d500.children.keep; level
3's ranks are not in a namespace.)"""

from __future__ import annotations

import json
import sys

import pytest

from d500.ledger import Ledger
from d500.training import resume

from . import entries

PEEK = '''
import json, os, shutil, sqlite3, tempfile
from d500.training.optimizers import Optimizer


def look(home):
    found = {"listed": None, "files": [], "ledger_bytes": 0, "evaluations": []}
    try:
        found["listed"] = sorted(os.listdir(home))
    except OSError as err:
        found["listed"] = err.strerror
    for folder, _, names in os.walk(home):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    f.read(1)
                found["files"].append(os.path.relpath(path, home))
            except OSError:
                pass
    ledger = os.path.join(home, "ledger.sqlite")
    copy = tempfile.mkdtemp()
    for suffix in ("", "-wal"):
        try:
            with open(ledger + suffix, "rb") as f:
                data = f.read()
            found["ledger_bytes"] += len(data)
            with open(os.path.join(copy, "ledger.sqlite" + suffix), "wb") as out:
                out.write(data)
        except OSError:
            pass
    if os.path.exists(os.path.join(copy, "ledger.sqlite")):
        try:
            db = sqlite3.connect(os.path.join(copy, "ledger.sqlite"))
            found["evaluations"] = [json.loads(m)["val_accuracy"] for (m,) in
                                    db.execute("SELECT metrics FROM evaluations")]
            db.close()
        except (sqlite3.Error, KeyError, ValueError):
            pass
    shutil.rmtree(copy, ignore_errors=True)
    return found


class Peek(Optimizer):
    name = "peek"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) % 20 == 0:
            with open(os.environ["D500_READ"], "a") as out:
                out.write(json.dumps(look(os.environ["D500_HOME"])) + "\\n")
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # (a real run of 2 epochs, a checkpoint after the first: ~10 s)
@pytest.mark.skipif(sys.platform != "linux", reason="mount namespaces are Linux's")
def test_the_entry_reads_nothing_of_the_results_directory(home, tmp_path, monkeypatch):
    read = tmp_path / "read.jsonl"
    monkeypatch.setenv("D500_READ", str(read))
    ledger = Ledger()
    (home / "reproduce").mkdir()
    entry = entries.entry(home / "reproduce", PEEK, "Peek", name="peek")
    result = entries.run(entry, epochs=2, ledger=ledger, checkpoints=resume.Checkpoints(1))
    assert result.status in ("succeeded", "missed"), result.error
    run = ledger.get(result.run_id)
    looks = [json.loads(line) for line in read.read_text().splitlines()]
    assert len(looks) >= 2, looks  # it looked in every epoch
    # the judge recorded evaluations and checkpoints meanwhile (what there was to read)
    assert len(run["evaluations"]) == 2 and len(run["details"]["checkpoints"]) == 1
    for found in looks:
        # (before: 152 kB of ledger at its first look, the first epoch's validation accuracy
        # in its copy in the second epoch, 0.807 and 0.827 in two tries, the MLLOG and the
        # checkpoint listed)
        assert found["ledger_bytes"] == 0 and found["evaluations"] == [], found
        assert found["listed"] == ["cache", "reproduce"], found  # its cache's, its own folder's
        assert found["files"] and all(f.startswith(("cache/entries/", "reproduce/entry/"))
                                      for f in found["files"]), found
