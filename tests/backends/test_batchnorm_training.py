"""Training-mode BatchNormalization through the Trainers (torch, tensorflow, reference): the
training form of a model, batch statistics in step(), running statistics as buffers updated by
momentum, predictions from the running statistics, cross-framework parity on ResNet-20, models
without batch norm untouched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from d500 import backends
from d500.backends.training_graph import running_statistics, training_graph
from d500.builders import _Graph, build
from d500.errors import UsageError
from d500.training.optimizers.registry import make

TRAINABLE = ["torch", "tensorflow", "reference"]
LR = 0.1
MOMENTUM = 0.9  # BatchNormalization's default


def tiny(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """conv3x3(3->4, no bias) -> BatchNormalization -> Relu -> GlobalAveragePool -> Gemm(5),
    loss."""
    g = _Graph(seed)
    h = g.relu(g.batchnorm(g.conv("input", 3, 4, 3, pad=1, bias=False), 4))
    h = g.flatten(g.node("GlobalAveragePool", [h], g.name("gap")))
    g.gemm(h, 4, 5, last=True)
    g.nodes[-1].output[0] = "logits"
    g.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"],
                                    reduction="mean"))
    graph = helper.make_graph(
        g.nodes, "tiny_bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def batches(steps: int, n: int = 8, classes: int = 5, seed: int = 0) -> list[dict]:
    """Synthetic 3x16x16 batches whose channels have non-zero means (the statistics matter)."""
    rng = np.random.default_rng(seed)
    return [{"input": (rng.normal(size=(n, 3, 16, 16)) * [[[0.5]], [[2.0]], [[1.0]]]
                       + [[[1.0]], [[-0.5]], [[0.3]]]).astype(np.float32),
             "labels": rng.integers(0, classes, n)} for _ in range(steps)]


def by_hand(p: dict[str, np.ndarray], feeds: dict, stats: dict[str, np.ndarray] | None = None):
    """The tiny model in torch.nn.functional: (logits, loss, conv output); batch statistics, or
    the running statistics `stats` when given."""
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    c = F.conv2d(torch.tensor(feeds["input"]), t["conv1.weight"], padding=1)
    if stats is None:
        h = F.batch_norm(c, None, None, t["bn1.scale"], t["bn1.bias"], True, 0.0, 1e-5)
    else:
        h = F.batch_norm(c, torch.tensor(stats["bn1.mean"]), torch.tensor(stats["bn1.var"]),
                         t["bn1.scale"], t["bn1.bias"], False, 0.0, 1e-5)
    logits = F.linear(F.relu(h).mean(dim=(2, 3)), t["fc1.weight"], t["fc1.bias"])
    loss = F.cross_entropy(logits, torch.tensor(feeds["labels"]))
    return logits, loss, c, t


def test_the_training_form_switches_batch_norm_to_training_mode():
    model = tiny()
    assert running_statistics(model) == ["bn1.mean", "bn1.var"]
    form = training_graph(model)
    assert form.updates == {"bn1.mean": "bn1.mean.updated", "bn1.var": "bn1.var.updated"}
    onnx.checker.check_model(form.model, full_check=True)
    bn = next(n for n in form.model.graph.node if n.op_type == "BatchNormalization")
    assert list(bn.output) == ["bn1", "bn1.mean.updated", "bn1.var.updated"]
    assert helper.get_node_attr_value(bn, "training_mode") == 1
    assert [o.name for o in form.model.graph.output][-2:] == list(form.updates.values())
    original = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    assert list(original.output) == ["bn1"]  # the model itself is left as it was
    resnet = build("resnet20", (3, 16, 16), 10, loss=True)
    assert len(running_statistics(resnet)) == 2 * 21  # 19 in the blocks, 2 projections
    for name in ("mlp", "lenet5"):  # no batch norm: the model itself, nothing to update
        plain = build(name, (1, 8, 8), 10, loss=True)
        assert training_graph(plain).model is plain and training_graph(plain).updates == {}


def test_what_is_not_a_running_statistic():
    # below opset 14 the same nodes count: training_graph converts the model to opset 15
    assert running_statistics(tiny(opset=13)) == ["bn1.mean", "bn1.var"]
    shared = tiny()
    shared.graph.node.append(helper.make_node("Identity", ["bn1.mean"], ["m"]))
    shared.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [4]))
    assert running_statistics(shared) == []  # read by another node: left as written


@pytest.mark.parametrize("backend", TRAINABLE)
def test_step_normalises_with_the_batch_and_updates_the_running_statistics(backend):
    exe = backends.get(backend).prepare(tiny())
    trainer = exe.trainer(make("sgd", lr=LR))
    assert trainer.buffer_names == ["bn1.mean", "bn1.var"]
    assert "bn1.mean" not in trainer.parameter_names and "bn1.scale" in trainer.parameter_names
    assert sorted(trainer.parameters()) == sorted(trainer.parameter_names)
    start = {"bn1.mean": np.array([0.5, -0.2, 0.1, 0.0], np.float32),
             "bn1.var": np.array([2.0, 0.5, 1.0, 3.0], np.float32)}
    trainer.set_buffers(start)
    before = trainer.parameters()
    feeds = batches(1)[0]

    _, loss, c, t = by_hand(before, feeds)
    loss.backward()
    assert trainer.step(feeds, LR) == pytest.approx(loss.item(), rel=1e-5)
    _, inference_loss, _, _ = by_hand(before, feeds, start)
    assert abs(inference_loss.item() - loss.item()) > 1e-2  # the two forms differ here

    c = c.detach().numpy().astype(np.float64)
    buffers = trainer.buffers()
    np.testing.assert_allclose(buffers["bn1.mean"], MOMENTUM * start["bn1.mean"]
                               + (1 - MOMENTUM) * c.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buffers["bn1.var"], MOMENTUM * start["bn1.var"]
                               + (1 - MOMENTUM) * c.var(axis=(0, 2, 3)), rtol=1e-5)
    after = trainer.parameters()  # plain SGD from the batch-statistics gradients
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value - LR * t[name].grad.numpy(),
                                   rtol=1e-4, atol=1e-6, err_msg=name)

    # predictions: the running statistics, not the batch's
    x = batches(1, n=3, seed=1)[0]
    expected, _, _, _ = by_hand(after, x, buffers)
    np.testing.assert_allclose(trainer.predict({"input": x["input"]}),
                               expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    batch_form, _, _, _ = by_hand(after, x)
    assert np.abs(expected.detach().numpy() - batch_form.detach().numpy()).max() > 1e-2
    np.testing.assert_array_equal(trainer.buffers()["bn1.mean"], buffers["bn1.mean"])  # kept
    np.testing.assert_allclose(exe.run({"input": x["input"], "labels": x["labels"]})[0],
                               expected.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", TRAINABLE)
def test_running_statistics_get_no_gradient_and_are_set_apart(backend):
    trainer = backends.get(backend).prepare(tiny()).trainer(make("momentum", lr=LR))
    feeds = batches(2)
    _, grads = trainer.gradients(feeds[0])
    assert sorted(grads) == sorted(trainer.parameter_names)
    before = trainer.buffers()
    assert not np.array_equal(before["bn1.mean"], np.zeros(4))  # gradients() is a training forward
    trainer.apply(grads, LR)
    np.testing.assert_array_equal(trainer.buffers()["bn1.var"], before["bn1.var"])  # apply: not
    with pytest.raises(UsageError, match="'bn1.mean' is a running statistic"):
        trainer.set_parameters({"bn1.mean": np.zeros(4)})
    with pytest.raises(UsageError, match="'bn1.scale' is a parameter"):
        trainer.set_buffers({"bn1.scale": np.zeros(4)})
    with pytest.raises(UsageError, match="'nosuch' is not a running statistic"):
        trainer.set_buffers({"nosuch": np.zeros(4)})
    with pytest.raises(UsageError, match="no gradient for parameter"):
        trainer.apply({k: v for k, v in grads.items() if k != "bn1.scale"}, LR)
    trainer.apply({**grads, "bn1.mean": np.ones(4)}, LR)  # a stray statistic's "gradient": unread
    np.testing.assert_array_equal(trainer.buffers()["bn1.mean"], before["bn1.mean"])


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_native_optimizers_leave_the_running_statistics_to_the_forward(backend):
    feeds = batches(3)
    runs = {}
    for native in (False, True):
        trainer = backends.get(backend).prepare(tiny()).trainer(
            make("momentum", lr=LR), native=native)
        runs[native] = ([trainer.step(f, LR) for f in feeds], trainer.buffers(),
                        trainer.parameters())
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    for key in ("bn1.mean", "bn1.var"):
        np.testing.assert_allclose(runs[True][1][key], runs[False][1][key], rtol=1e-5)
    for key, value in runs[False][2].items():
        np.testing.assert_allclose(runs[True][2][key], value, rtol=1e-4, atol=1e-6)


def test_the_framework_holds_running_statistics_as_state():
    torch_exe = backends.get("torch").prepare(tiny())
    trainer = torch_exe.trainer(make("sgd", lr=LR))
    module = torch_exe.native
    names = {v: k for k, v in module.attr_names.items()}
    assert {names[n] for n, _ in module.named_buffers()} >= {"bn1.mean", "bn1.var"}
    assert "bn1.mean" not in {names[n] for n, _ in module.named_parameters()}
    buffer = torch_exe.native.values["bn1.mean"]
    trainer.step(batches(1)[0], LR)
    assert torch_exe.native.values["bn1.mean"] is buffer and buffer.abs().sum() > 0  # in place
    # the executable (level 1) still differentiates them, as parameters of the inference form
    _, grads = torch_exe.gradients(batches(1)[0], output="loss", wrt=["bn1.mean", "bn1.var"])
    ref = backends.get("reference").prepare(tiny())
    ref.set_parameters(torch_exe.parameters())
    _, expected = ref.gradients(batches(1)[0], output="loss", wrt=["bn1.mean", "bn1.var"])
    for key, value in expected.items():
        np.testing.assert_allclose(grads[key], value, rtol=1e-4, atol=1e-7, err_msg=key)
    tf_exe = backends.get("tensorflow").prepare(tiny())
    assert not tf_exe.native.params["bn1.var"].trainable
    tf_trainer = tf_exe.trainer(make("sgd", lr=LR))
    variable = tf_exe.native.params["bn1.var"]
    tf_trainer.step(batches(1)[0], LR)
    assert tf_exe.native.params["bn1.var"] is variable
    assert not np.allclose(variable.numpy(), 1.0)


# -- the same steps on every framework -------------------------------------------------------
# LeNet-5's bound from test_trainer.py (1e-3 relative over 20 steps) over a few steps of
# ResNet-20 in training mode.
def test_resnet20_trains_alike_on_every_framework():
    model = build("resnet20", (3, 16, 16), 10, seed=0, loss=True)
    feeds = batches(4, n=8, classes=10)
    runs = {}
    for backend in TRAINABLE:
        trainer = backends.get(backend).prepare(model).trainer(make("momentum", lr=LR))
        runs[backend] = ([trainer.step(f, LR) for f in feeds], trainer.buffers(),
                         trainer.predict({"input": feeds[0]["input"]}))
    losses, stats, logits = runs["torch"]
    assert len(stats) == 42 and all(np.isfinite(losses))
    for backend in ("tensorflow", "reference"):
        other, other_stats, other_logits = runs[backend]
        diff = np.max(np.abs(np.subtract(other, losses)) / np.abs(losses))
        print(f"\nresnet20, 4 steps: {backend}/torch max relative loss difference {diff:.1e}")
        assert diff <= 1e-3, (backend, other, losses)
        for key, value in stats.items():
            np.testing.assert_allclose(other_stats[key], value, rtol=1e-3,
                                       atol=1e-3 * np.abs(value).max(), err_msg=key)
        np.testing.assert_allclose(other_logits, logits, rtol=1e-3,
                                   atol=1e-3 * np.abs(logits).max())


@pytest.mark.parametrize("backend", TRAINABLE)
def test_gradients_then_apply_equals_step_with_batch_norm(backend):
    feeds = batches(3)
    stepped, split = (backends.get(backend).prepare(tiny()).trainer(make("sgd", lr=LR))
                      for _ in range(2))
    for f in feeds:
        loss = stepped.step(f, LR)
        split_loss, grads = split.gradients(f)
        split.apply(grads, LR)
        assert split_loss == pytest.approx(loss, rel=1e-6)
    for mine, theirs in ((split.parameters(), stepped.parameters()),
                         (split.buffers(), stepped.buffers())):
        for key, value in theirs.items():
            np.testing.assert_allclose(mine[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def test_models_without_batch_norm_have_no_buffers():
    exe = backends.get("torch").prepare(build("lenet5", (1, 8, 8), 10, loss=True))
    trainer = exe.trainer(make("sgd", lr=LR))
    assert trainer.buffer_names == [] and trainer.buffers() == {}
    assert trainer.parameter_names == exe.parameter_names
    assert trainer.train_plan.program is exe.native.program  # the very graph, not a copy
    with pytest.raises(UsageError, match="not a running statistic"):
        trainer.set_buffers({"conv1.weight": np.zeros(1)})
