"""The tensor split in one process (d500.distributed.tensor): which weights a transformer and the
digits MLP split how, the shards covering each weight exactly once, a 1-way split's segments
training as the whole model does (tied embedding included), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from d500 import backends
from d500.builders import build, build_lm
from d500.distributed.tensor.rank import RankModel
from d500.distributed.tensor.split import find
from d500.errors import UsageError
from d500.training.optimizers.registry import make


def lm(**options):
    return build_lm("transformer", 8, 16, seed=1, loss=True, **{"layers": 1, "width": 32,
                                                                   "heads": 2, **options})


def test_a_transformer_layer_splits_its_heads_and_its_mlp():
    split = find(lm(), 2)
    assert [len(b.columns) for b in split.blocks] == [3, 1]  # Q, K, V; the MLP's first linear
    assert split.axes == {**{f"linear{i}.weight": 1 for i in (1, 2, 3, 5)},
                          **{f"linear{i}.bias": 0 for i in (1, 2, 3, 5)},
                          "linear4.weight": 0, "linear6.weight": 0}
    model, blocks = split.rank_model(1)
    heads = [numpy_helper.to_array(t) for t in model.graph.initializer
             if t.name.startswith("heads.shape::tp")]
    assert heads and all(list(h) == [0, 0, 1, 16] for h in heads)  # 1 of the 2 heads
    assert len(blocks) == len(model.graph.node) and set(blocks) == {-1, 0, 1}


def test_the_shards_cover_every_split_weight_once():
    model = build("mlp", (1, 8, 8), 10, seed=0, loss=True)
    split = find(model, 2)
    whole = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shards = [{t.name: numpy_helper.to_array(t) for t in split.rank_model(r)[0].graph.initializer}
              for r in range(2)]
    for name, axis in split.axes.items():
        assert np.array_equal(np.concatenate([s[name] for s in shards], axis=axis), whole[name])
    assert shards[0]["fc3.weight"] is not None and np.array_equal(shards[1]["fc3.weight"],
                                                                  whole["fc3.weight"])
    assert split.rank_bytes() == 35880  # half of fc1 and fc2, all of fc3 and fc2's bias
    assert "fc1 (column) -> fc2 (row)" in split.show()


def test_one_way_segments_train_as_the_whole_model():
    """At T = 1 the segments with identity allreduces are the whole model cut apart: the same
    losses as the translated model's own trainer (the tied embedding read in two segments)."""
    model = lm()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 16, (5, 4, 9))
    batches = [{"input": t[:, :-1], "labels": t[:, 1:]} for t in tokens]
    cls = backends.get("torch")
    parts = RankModel(find(model, 1), 0, cls, make("momentum", lr=0.1, momentum=0.9), False,
                      lambda a: a)
    assert len(parts.segments) == 5 and "wte" in parts.segments[-1].inputs
    one = cls.prepare(model).trainer(make("momentum", lr=0.1, momentum=0.9))
    for b in batches:
        loss, grads = parts.gradients(b)
        parts.trainer.apply(grads, 0.1)
        assert loss == pytest.approx(one.step(b, 0.1), rel=1e-5)


def test_what_cannot_be_split_is_one_line():
    with pytest.raises(UsageError, match="no column -> row linear chain"):
        find(build("resnet20", (3, 8, 8), 10, loss=True), 2, where="e.yaml")
    with pytest.raises(UsageError, match="'fc1.weight' of shape .* does not split 3 ways"):
        find(build("mlp", (1, 8, 8), 10, loss=True), 3)
