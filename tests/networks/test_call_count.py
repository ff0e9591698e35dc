"""Issue 17 at level 1: a hosted backend (d500.networks.hosted) is timed in round trips of `inner`
calls, figure = a round trip's time / inner. A backend whose module patches its host's loop so
that a round trip runs one call, or answers its earlier calls with a stale output, would be
timed up to `inner` times faster; each call now runs on its own shifted input and returns its
checksums, and the judge recomputes calls drawn from all round trips after timing, so both are
recorded failed (fail when only each round trip's last call was checked). An honest hosted
backend passes."""

from __future__ import annotations

import textwrap

import pytest

from d500 import backends
from d500.ledger import Ledger
from d500.networks import workloads
from d500.networks.bench import bench
from tests.helpers import install_plugin, tiny_mlp

# Three backends of one installed package, each the reference evaluator; "last" and "stale"
# patch their host's round trip (the one place every hosted call is repeated) on import.
PLUGIN = '''
import numpy as np

from d500.backends.hooks import Framework
from d500.backends.reference import ReferenceBackend
from d500.operators import host

FRAMEWORK = Framework("honest", module="countfw", distribution="countfw",
                      optimizer_ops="d500.backends.reference.optimizer_ops")
_real = host._checked_calls


class HonestBackend(ReferenceBackend):
    name = "honest"


class _Cheat(ReferenceBackend):
    @classmethod
    def prepare(cls, model, *args, **kwargs):
        exe = super().prepare(model, *args, **kwargs)
        exe.cheat = cls.name  # what its host's round trips do with its calls
        return exe


class LastBackend(_Cheat):
    """A round trip runs one call; its checksums are copied to every call."""
    name = "last"


class StaleBackend(_Cheat):
    """A round trip's earlier calls are answered with the outputs last computed (checksummed
    honestly); only its last call is computed."""
    name = "stale"


def _one_call(run, checked, calls, seed, scale):
    return np.repeat(_real(run, checked, 1, seed, scale), calls, axis=0)


def _stale(run, checked, calls, seed, scale):
    apply, done, kept = checked["apply"], [0], checked.setdefault("kept", [])

    def cheap(offsets):
        done[0] += 1
        if done[0] < calls and kept:
            return kept[0]
        kept[:] = [[np.array(o, copy=True) for o in apply(offsets)]]
        return kept[0]
    checked["apply"] = cheap
    try:
        return _real(run, checked, calls, seed, scale)
    finally:
        checked["apply"] = apply


def _checked_calls(run, checked, calls, seed, scale):
    cheat = {"last": _one_call, "stale": _stale}.get(getattr(run.exe, "cheat", None), _real)
    return cheat(run, checked, calls, seed, scale)


host._checked_calls = _checked_calls
'''


def install(tmp_path, monkeypatch, plugin: str, name: str, workload: str):
    """`plugin` as the installed package countfw of three backends, found on sys.path (the
    hosts, spawned, inherit it), third-party backends hosted from now on in this process (as
    `d500 net bench` makes them), and the workload file `name` of text `workload`, loaded."""
    install_plugin(tmp_path, "countfw", plugin,
                   {n: f"{n.title()}Backend" for n in ("honest", "last", "stale")})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_hosting", True)
    path = tmp_path / name
    path.write_text(textwrap.dedent(workload))
    return workloads.load(path)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The plugin installed, and a tiny MLP workload that trains."""
    return install(tmp_path, monkeypatch, PLUGIN, "tiny.yaml",
                   tiny_mlp(train=True, metrics=("latency", "train_step_time"),
                            rank_by="latency", budget=0.1))


@pytest.mark.parametrize("cheat", ["last", "stale"])
def test_a_host_skipping_calls_of_its_round_trips_is_recorded_failed(installed, tmp_path,
                                                                      cheat):
    result = bench(installed, [cheat], ledger=Ledger(tmp_path / "ledger.db"))
    (cheater,) = result.results
    assert cheater.status == "failed"
    assert "did not run every call it was timed for" in cheater.error, cheater.error
    assert "latency" not in cheater.figures  # its first timed figure already failed it
    (run,) = Ledger(tmp_path / "ledger.db").runs(level=1)
    assert run["status"] == "failed" and "did not run every call" in run["error"]


def test_an_honest_host_passes_every_call_checksummed(installed, tmp_path):
    result = bench(installed, ["honest"], ledger=Ledger(tmp_path / "ledger.db"))
    (honest,) = result.results
    assert honest.status == "succeeded", honest.error
    assert honest.figures["latency"] > 0 and honest.figures["train_step_time"] > 0
    for what in honest.details["hosted"].values():  # every call checksummed, some recomputed
        assert what["calls_checksummed"] and what["calls_checked"] >= 1, what
        assert what["calls_told_apart"] is not None, what
