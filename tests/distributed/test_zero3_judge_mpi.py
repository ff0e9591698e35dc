"""The zero-3 entry under the judge at `mpiexec -n 2`: it trains digits-mlp to its target layer by
layer, the judge audits it (the first loss after each hand-over recomputed on the gathered model)
and records memory_per_rank and peak_param_bytes from its own copy of the graph (each rank's rows,
and the largest layer, gathered one at a time). The attacks: ranks that gather each layer
once and train on those stale weights ever after are recorded failed by the audit; ranks that
claim a leaner peak than their rows and the largest layer get neither memory figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from d500.builders import build
from d500.distributed.schemes.zero3 import peak_bytes, shard_bytes
from d500.distributed.spec import parse
from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

# An entry's optimizer file that, on import in every rank, keeps each layer's first gather and
# hands it back ever after: each rank trains on stale copies of the other rank's rows (saving
# the allgathers) while the model handed to the judge is gathered afresh.
STALE = '''
from d500.distributed.schemes import zero3 as _zero3
from d500.training.optimizers.sgd import Momentum

_fetch, _arrived = _zero3.Zero3._fetch, _zero3.Zero3._arrived


class _Kept:
    def __init__(self, parts):
        self.parts = parts

    def wait(self):
        return [p.copy() for p in self.parts]


def _once(self, index, holding):
    kept = vars(self).setdefault("_kept", {})
    if index not in kept:
        kept[index] = _fetch(self, index, holding).wait()
    return _Kept(kept[index])


def _whole(self):
    out = {}
    for i in range(len(self.layers)):
        out.update(_arrived(self, i, _fetch(self, i, 0)))
    return out


_zero3.Zero3._fetch = _once
_zero3.Zero3._whole = _whole


class Stale(Momentum):
    name = "stale-momentum"
'''

# ... one that, on import in every rank, reports half the peak the scheme measured.
LEAN = '''
from d500.distributed.schemes import zero3 as _zero3
from d500.training.optimizers.sgd import Momentum

_figures = _zero3.Zero3.figures


def _lean(self):
    out = _figures(self)
    out["peak_param_bytes"] = out["param_bytes"]  # "never gathered a layer"
    return out


_zero3.Zero3.figures = _lean


class Lean(Momentum):
    name = "lean-momentum"
'''


def _last_run(home: Path) -> dict:
    return Ledger(home / "ledger.sqlite").runs(level=3)[-1]


def _cheating(tmp: Path, name: str, code: str, cls: str, epochs: int) -> tuple[Any, dict]:
    """The zero-3 entry at 2 ranks with optimizer file `name`.py (class `cls`) being `code`,
    for at most `epochs` epochs, and the run its judge recorded."""
    home = tmp / "home"
    wl = jobs.workload(tmp, "digits-mlp", budget={"max_epochs": epochs})
    entry = jobs.entry(tmp, "zero-3", folder=name, files={f"{name}.py": code}, name=name,
                       optimizer=f"{name}.py:{cls}")
    return jobs.train(home, 2, wl, entry, "--seed", "0"), _last_run(home)


def _judges_figures() -> tuple[dict[int, int], dict[int, int]]:
    model = build("mlp", (1, 8, 8), 10, seed=0, loss=True)
    spec = parse({"scheme": "sync", "shard": "zero3"}, "e.yaml")
    return shard_bytes(model, spec, 2), peak_bytes(model, spec, 2)


def test_the_zero3_entry_reaches_its_target_layer_by_layer_with_its_memory_judged(tmp_path):
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 12})
    out = jobs.train(home, 2, wl, jobs.ENTRIES / "zero-3", "--seed", "0")
    assert out.returncode == 0, out.stderr[-2000:]
    run = _last_run(home)
    assert run["status"] == "succeeded", run["error"]
    details, figures = run["details"], run["figures"]
    assert details["audited_steps"] >= 1
    rows, peaks = _judges_figures()
    assert [r["scheme"]["param_bytes"] for r in details["ranks"]] == [rows[0], rows[1]]
    assert [r["scheme"]["peak_param_bytes"] for r in details["ranks"]] == [peaks[0], peaks[1]]
    last = 4 * (64 * 128 + 64 + 10 * 64 + 10)  # the largest layer gathered: fc2 with fc3
    assert figures["peak_param_bytes"] == max(peaks.values()) == rows[0] + last  # one layer
    assert figures["bytes_per_step"] == 85544  # the judge's floor (least_sent), met exactly
    held = [sum(r["scheme"][k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
            for r in details["ranks"]]
    assert figures["memory_per_rank"] == max(held)


def test_ranks_on_stale_layers_are_caught_by_the_judge(tmp_path):
    out, run = _cheating(tmp_path, "stale", STALE, "Stale", 2)
    assert out.returncode != 0
    assert run["status"] == "failed", (run["status"], run["error"])
    assert "audit:" in run["error"], run["error"]


def test_ranks_claiming_a_leaner_peak_get_no_memory_figures(tmp_path):
    out, run = _cheating(tmp_path, "lean", LEAN, "Lean", 1)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    assert run["status"] in ("succeeded", "missed"), run["error"]
    rows, _ = _judges_figures()
    assert [r["scheme"]["peak_param_bytes"] for r in run["details"]["ranks"]] == [
        rows[0], rows[1]]  # the lie is in the record, and not believed
    assert "peak_param_bytes" not in run["figures"]
    assert "memory_per_rank" not in run["figures"]
