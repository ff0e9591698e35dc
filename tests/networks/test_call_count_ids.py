"""Issue 17 at level 1 for a model whose only inputs are token ids (text-lm's transformer, small):
each call of a hosted backend's round trip runs on ids of its own, (x_j + p[(j + r_i) % PATTERN])
mod the vocabulary (d500.networks.hosted.CallRunner), so a host that runs a round trip's last call
alone, or answers its earlier calls with stale outputs, is recorded failed (before, such a
model's calls ran unchecked and both passed, timed up to `inner` times faster); an honest host
passes, its calls told apart. The shifted ids stay inside the vocabulary and differ from call to
call at (nearly) every position, so no call's work is a cached prefix of another's."""

from __future__ import annotations

import numpy as np
import pytest

from d500.ledger import Ledger
from d500.networks.bench import bench
from d500.networks.hosted import CallRunner, _ordered
from d500.operators.host import Local
from tests.networks.test_call_count import PLUGIN, install

VOCAB = 128

# test_call_count's cheats, and the same skipping where a round trip's calls run unchecked
# (scale None: what a model with token ids alone got before), so that the attack has a target
# on the code before as well as after
IDS_PLUGIN = PLUGIN + '''
from d500.networks import hosted

_answer = hosted.operator_answer


def _unchecked(cls, state, message):
    if message[0] == "repeat" and message[4] is None and getattr(state["run"].exe, "cheat",
                                                                 None):
        message = (*message[:2], min(1, message[2]), *message[3:])  # one call, not `calls`
    return _answer(cls, state, message)


hosted.operator_answer = _unchecked
'''

LM = f"""\
name: tiny-lm
level: 1
model: {{builder: transformer, context: 16, vocab: {VOCAB}, layers: 1, width: 16, heads: 2,
        tied: true, seed: 0}}
batch_size: 4
train: true
budget: 0.1
metrics: [latency, train_step_time]
rank_by: latency
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The plugin package on sys.path (its hosts inherit it), third-party backends hosted from
    now on in this process, and a small text-lm workload (token ids alone)."""
    return install(tmp_path, monkeypatch, IDS_PLUGIN, "tiny-lm.yaml", LM)


@pytest.mark.parametrize("cheat", ["last", "stale"])
def test_a_host_skipping_calls_on_token_ids_is_recorded_failed(installed, tmp_path, cheat):
    result = bench(installed, [cheat], ledger=Ledger(tmp_path / "ledger.db"))
    (cheater,) = result.results
    assert cheater.status == "failed", cheater.figures
    assert "did not run every call it was timed for" in cheater.error, cheater.error
    (run,) = Ledger(tmp_path / "ledger.db").runs(level=1)
    assert run["status"] == "failed" and "did not run every call" in run["error"]


def test_an_honest_host_on_token_ids_passes_its_calls_told_apart(installed, tmp_path):
    result = bench(installed, ["honest"], ledger=Ledger(tmp_path / "ledger.db"))
    (honest,) = result.results
    assert honest.status == "succeeded", honest.error
    assert "hosted_note" not in honest.details, honest.details["hosted_note"]
    for what in honest.details["hosted"].values():
        assert what["calls_checksummed"] and what["calls_checked"] >= 1, what
        assert what["ids_shifted_mod"] == VOCAB, what
        assert what["calls_told_apart"] >= 0.6, what  # 8 runs read 0.93-1.00


def test_each_call_gets_valid_ids_new_at_nearly_every_position(installed):
    """A forward's calls, as the host runs them: ids inside the vocabulary, and two calls'
    ids differ at about 1 - 1/VOCAB of positions (the shift is uniform mod VOCAB)."""
    from d500.operators.host import _checked_calls
    model, _ = installed.onnx_model()
    seen = []

    class Recording:
        def run(self, feeds):
            (ids,) = [v for v in feeds.values()]
            seen.append(np.array(ids, copy=True))
            return [ids.astype(np.float32)]

    feeds = {"input": np.zeros((4, 16), dtype=np.int64)}
    names, inputs, vocab = _ordered(feeds, model)
    assert vocab == VOCAB
    local = Local(CallRunner(Recording(), "forward", names, None, None, vocab))
    local.ask("prepare", "forward", inputs, None, 12345)
    sums = _checked_calls(local.state["run"], local.state["checked forward"], 20, 7,
                          2.0 * VOCAB)
    assert sums.shape == (20, 1) and len(seen) == 20
    ids = np.stack(seen)
    assert ids.min() >= 0 and ids.max() < VOCAB and len(np.unique(ids)) > VOCAB * 0.9
    for a in range(20):
        for b in range(a):
            assert np.mean(ids[a] != ids[b]) > 0.9
    assert len(np.unique(sums)) == 20


def test_token_ids_are_sized_once_never_grown(installed):
    """Uniform over the vocabulary at any scale: a loose tolerance (few pairs told apart) grows a
    float input's shift (level 0's calibrate), never the ids' (it would only cost calls)."""
    from d500.backends import get
    from d500.networks.hosted import checked_local
    model, path = installed.onnx_model()
    exe = get("reference").prepare(str(path))
    feeds = {"input": np.zeros((1, 16), dtype=np.int64)}
    fn = checked_local(exe, "forward", feeds)
    assert fn.vocab == VOCAB and fn.scale == 2.0 * VOCAB
    fn.calibrate(fn._reference(exe), 0.0, 0.5)  # bounds as wide as the outputs: little power
    assert fn.scale == 2.0 * VOCAB and fn.power is not None and fn.power < 0.95
    fn.calibrate(fn._reference(exe), 0.0, 1e-3)
    assert fn.power > 0.8
