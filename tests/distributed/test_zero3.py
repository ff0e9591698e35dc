"""ZeRO stage 3's parts that need no MPI: the judge's figure of each rank's block (from its own
copy of the model), the memory claims it believes or not (the attack: a rank that reports
parameter bytes it does not hold), and the refusals (one line)."""

from __future__ import annotations

import numpy as np
import pytest

from d500 import backends
from d500.builders import build
from d500.distributed.comm import Communicator
from d500.distributed.figures import held_memory
from d500.distributed.schemes.zero import Zero, shard_bytes
from d500.distributed.spec import parse
from d500.errors import UsageError
from d500.training.optimizers.registry import make as make_optimizer
from tests.distributed.test_memory import ranks

MLP = build("mlp", (1, 8, 8), 10, seed=0, loss=True)
SPEC = parse({"scheme": "sync", "shard": "zero3"}, "e.yaml")


def test_the_judges_blocks_cover_the_model_once_in_whole_tensors():
    blocks = shard_bytes(MLP, SPEC, 2)
    whole = 4 * (128 * 64 + 128 + 64 * 128 + 64 + 10 * 64 + 10)
    assert sum(blocks.values()) == whole
    assert max(blocks.values()) < 0.55 * whole  # about half each (whole tensors)


def test_a_rank_claiming_bytes_it_does_not_hold_is_not_believed():
    b0, b1 = shard_bytes(MLP, SPEC, 2).values()
    honest = ranks((b0, b0, 2 * b0), (b1, b1, 2 * b1))
    assert held_memory(honest, b0 + b1, {0: b0, 1: b1}) == max(4 * b0, 4 * b1)
    lean = ranks((b0 // 2, b0, 2 * b0), (b1, b1, 2 * b1))  # half its block: "leaner"
    assert held_memory(lean, b0 + b1, {0: b0, 1: b1}) is None
    whole = ranks((b0 + b1, b0, 0), (b0 + b1, b1, 0))  # never freed the others' blocks
    assert held_memory(whole, b0 + b1, {0: b0, 1: b1}) is None
    partial = ranks((b0, b0 // 2, 0), (b1, b1 // 2, 0))  # gradients that do not cover B
    assert held_memory(partial, b0 + b1, {0: b0, 1: b1}) is None


def torch_trainer():
    return backends.get("torch").prepare(MLP).trainer(make_optimizer("sgd", lr=0.1), loss="loss")


def test_zero3_frees_torch_storage_so_other_backends_are_one_line():
    exe = backends.get("reference").prepare(MLP)
    t = exe.trainer(make_optimizer("sgd", lr=0.1), loss="loss")
    with pytest.raises(UsageError, match="torch backend on CPU only"):
        Zero(t, Communicator.single(), stage=3)


def test_one_rank_holds_the_whole_model_and_trains_as_sync():
    """At one rank the block is the model: nothing freed, the update sync's."""
    zero = Zero(torch_trainer(), Communicator.single(), stage=3)
    plain = torch_trainer()
    zero.start()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((8, 1, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, 8).astype(np.int64)}
    for _ in range(3):
        assert zero.step(feeds, 0.1) == pytest.approx(plain.step(feeds, 0.1), rel=1e-6)
    assert zero.memory()["param_bytes"] == sum(a.nbytes for a in plain.parameters().values())
