"""Training-mode BatchNormalization for models below opset 14 (BatchNormalization-7/9 has no
training_mode): converted to opset 15 before the training form is built, they train on torch,
TensorFlow and the reference exactly as the same model written at opset 15; a model onnx's version
converter cannot convert is one line naming it; models without batch norm are never converted."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from d500 import backends
from d500.backends.training_graph import running_statistics, training_graph
from d500.errors import D500Error, ModelError
from d500.training.optimizers.registry import make

TRAINABLE = ["torch", "tensorflow", "reference"]
OLD_OPSETS = [9, 11, 13]
LR, MOMENTUM, EPSILON, STEPS = 0.1, 0.8, 1e-3, 3
STATS = ["bn.mean", "bn.var"]


def conv_bn(opset: int, batch_norm: bool = True) -> onnx.ModelProto:
    """conv3x3(3->4, bias) -> BatchNormalization(momentum 0.8, epsilon 1e-3) -> Relu ->
    GlobalAveragePool -> Flatten -> Gemm(5) = logits; loss = the batch mean of
    -sum(target * LogSoftmax(logits)), written for `opset` (ReduceSum's axes an attribute below
    13, an input from 13). Same weights at every opset; running statistics away from 0 and 1."""
    rng = np.random.default_rng(0)
    arrays = {"conv.w": rng.normal(0, 0.4, (4, 3, 3, 3)), "conv.b": rng.normal(0, 0.1, 4),
              "bn.scale": rng.uniform(0.5, 1.5, 4), "bn.bias": rng.normal(0, 0.2, 4),
              "bn.mean": rng.normal(0, 0.5, 4), "bn.var": rng.uniform(0.5, 2.0, 4),
              "fc.w": rng.normal(0, 0.5, (5, 4)), "fc.b": np.zeros(5)}
    if not batch_norm:
        arrays = {k: v for k, v in arrays.items() if not k.startswith("bn.")}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [helper.make_node("Conv", ["input", "conv.w", "conv.b"], ["conv"], pads=[1] * 4)]
    if batch_norm:
        nodes.append(helper.make_node("BatchNormalization",
                                      ["conv", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                                      ["bn"], momentum=MOMENTUM, epsilon=EPSILON))
    nodes += [helper.make_node("Relu", [nodes[-1].output[0]], ["relu"]),
              helper.make_node("GlobalAveragePool", ["relu"], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1),
              helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=1),
              helper.make_node("Mul", ["logp", "target"], ["picked"])]
    if opset < 13:
        nodes.append(helper.make_node("ReduceSum", ["picked"], ["nll"], axes=[1], keepdims=0))
    else:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
        nodes.append(helper.make_node("ReduceSum", ["picked", "axes"], ["nll"], keepdims=0))
    nodes += [helper.make_node("ReduceMean", ["nll"], ["mean_nll"], keepdims=0),
              helper.make_node("Neg", ["mean_nll"], ["loss"])]
    graph = helper.make_graph(
        nodes, f"conv_bn_opset{opset}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8]),
         helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def batches(steps: int, n: int = 6, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Synthetic batches whose channels have non-zero means (batch and running statistics
    differ), one-hot targets."""
    rng = np.random.default_rng(seed)
    return [{"input": (rng.normal(size=(n, 3, 8, 8)) * [[[0.5]], [[2.0]], [[1.0]]]
                       + [[[1.0]], [[-0.5]], [[0.3]]]).astype(np.float32),
             "target": np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]}
            for _ in range(steps)]


def by_hand(p: dict[str, np.ndarray], x: np.ndarray, stats: dict[str, np.ndarray] | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """The model's (logits, conv output) in torch.nn.functional: batch statistics, or the running
    statistics `stats` when given."""
    t = {k: torch.tensor(v) for k, v in p.items()}
    c = F.conv2d(torch.tensor(x), t["conv.w"], t["conv.b"], padding=1)
    mean, var = (None, None) if stats is None else (torch.tensor(stats["bn.mean"]),
                                                    torch.tensor(stats["bn.var"]))
    h = F.batch_norm(c, mean, var, t["bn.scale"], t["bn.bias"], stats is None, 0.0, EPSILON)
    logits = F.linear(F.relu(h).mean(dim=(2, 3)), t["fc.w"], t["fc.b"])
    return logits.numpy(), c.numpy().astype(np.float64)


def train(backend: str, opset: int) -> dict:
    """STEPS momentum steps of `conv_bn(opset)` on `backend`: losses, gradients of the first
    step's batch, parameters, running statistics and predictions after, and the trainer."""
    exe = backends.get(backend).prepare(conv_bn(opset))
    trainer = exe.trainer(make("momentum", lr=LR))
    feeds = batches(STEPS)
    losses = [trainer.step(f, LR) for f in feeds]
    held_out = batches(1, n=4, seed=1)[0]["input"]
    return {"losses": losses, "parameters": trainer.parameters(), "buffers": trainer.buffers(),
            "predict": trainer.predict({"input": held_out}), "held_out": held_out,
            "trainer": trainer, "executable": exe}


@functools.cache
def at_opset_15(backend: str) -> dict:
    return train(backend, 15)


@pytest.mark.parametrize("opset", [7, *OLD_OPSETS])
def test_a_model_below_opset_14_gets_the_opset_15_training_form(opset):
    model = conv_bn(opset)
    before = model.SerializeToString()
    assert running_statistics(model) == STATS
    form = training_graph(model)
    assert form.updates == {"bn.mean": "bn.mean.updated", "bn.var": "bn.var.updated"}
    assert [(o.domain, o.version) for o in form.model.opset_import] == [("", 15)]
    onnx.checker.check_model(form.model, full_check=True)
    bn = next(n for n in form.model.graph.node if n.op_type == "BatchNormalization")
    attrs = {a.name: helper.get_attribute_value(a) for a in bn.attribute}
    assert attrs == {"momentum": pytest.approx(MOMENTUM), "epsilon": pytest.approx(EPSILON),
                     "training_mode": 1}
    assert list(bn.input) == ["conv", "bn.scale", "bn.bias", "bn.mean", "bn.var"]
    assert list(bn.output) == ["bn", "bn.mean.updated", "bn.var.updated"]
    assert [o.name for o in form.model.graph.output] == ["logits", "loss", *form.updates.values()]
    assert {t.name: numpy_helper.to_array(t).tobytes() for t in form.model.graph.initializer} \
        == {t.name: numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}
    assert model.SerializeToString() == before  # the model itself is left as it was
    new = training_graph(conv_bn(15))  # the same model written at opset 15
    assert new.updates == form.updates
    assert next(n for n in new.model.graph.node if n.op_type == "BatchNormalization") == bn


@pytest.mark.parametrize("backend", TRAINABLE)
@pytest.mark.parametrize("opset", OLD_OPSETS)
def test_an_old_opset_trains_exactly_like_opset_15(backend, opset):
    new, old = at_opset_15(backend), train(backend, opset)
    trainer = old["trainer"]
    assert trainer.buffer_names == STATS
    assert not set(STATS) & set(trainer.parameter_names)
    assert sorted(trainer.parameters()) == sorted(trainer.parameter_names) == sorted(
        ["conv.w", "conv.b", "bn.scale", "bn.bias", "fc.w", "fc.b"])
    np.testing.assert_allclose(old["losses"], new["losses"], rtol=1e-5)
    for key in ("parameters", "buffers"):
        assert sorted(old[key]) == sorted(new[key])
        for name, value in new[key].items():
            np.testing.assert_allclose(old[key][name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{backend} opset {opset}: {name}")
    np.testing.assert_allclose(old["predict"], new["predict"], rtol=1e-5, atol=1e-6)
    _, grads = trainer.gradients(batches(1, seed=2)[0])
    assert sorted(grads) == sorted(trainer.parameter_names)  # no gradient for a statistic


@pytest.mark.parametrize("backend", TRAINABLE)
def test_an_old_opset_updates_the_statistics_by_momentum_and_predicts_with_them(backend):
    exe = backends.get(backend).prepare(conv_bn(9))
    trainer = exe.trainer(make("sgd", lr=LR))
    start, params = trainer.buffers(), trainer.parameters()
    feeds = batches(1)[0]
    trainer.step(feeds, LR)
    _, c = by_hand(params, feeds["input"])  # the batch statistics of the conv output
    stats = trainer.buffers()
    np.testing.assert_allclose(stats["bn.mean"], MOMENTUM * start["bn.mean"]
                               + (1 - MOMENTUM) * c.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["bn.var"], MOMENTUM * start["bn.var"]
                               + (1 - MOMENTUM) * c.var(axis=(0, 2, 3)), rtol=1e-5)
    x = batches(1, n=4, seed=1)[0]["input"]
    expected, _ = by_hand(trainer.parameters(), x, stats)
    np.testing.assert_allclose(trainer.predict({"input": x}), expected, rtol=1e-4, atol=1e-5)
    batch_form, _ = by_hand(trainer.parameters(), x)
    assert np.abs(expected - batch_form).max() > 1e-2  # the two forms differ here
    if backend == "torch":  # the framework holds the statistics as state, not parameters
        names = {v: k for k, v in exe.native.attr_names.items()}
        assert {names[n] for n, _ in exe.native.named_buffers()} >= set(STATS)
        assert not set(STATS) & {names[n] for n, _ in exe.native.named_parameters()}
    if backend == "tensorflow":
        assert not any(exe.native.params[n].trainable for n in STATS)
        assert exe.native.params["bn.scale"].trainable


def test_a_model_without_batch_norm_is_not_converted():
    plain = conv_bn(9, batch_norm=False)
    assert running_statistics(plain) == []
    assert training_graph(plain).model is plain and training_graph(plain).updates == {}
    shared = conv_bn(9)  # its statistics also read by another node: left as written
    shared.graph.node.append(helper.make_node("Identity", ["bn.mean"], ["m"]))
    shared.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [4]))
    assert running_statistics(shared) == []
    assert training_graph(shared).model is shared


def per_activation() -> onnx.ModelProto:
    """MatMul(6->4) -> BatchNormalization-7 with spatial=0 -> ReduceMean = loss, at opset 7: runs
    on every backend, but onnx's version converter refuses spatial=0."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 4)).astype(np.float32), "fc.w")] + [
        numpy_helper.from_array(np.full(4, v, np.float32), f"bn.{k}")
        for k, v in (("scale", 1.0), ("bias", 0.0), ("mean", 0.1), ("var", 2.0))]
    nodes = [helper.make_node("MatMul", ["input", "fc.w"], ["fc"]),
             helper.make_node("BatchNormalization",
                              ["fc", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"],
                              spatial=0),
             helper.make_node("ReduceMean", ["bn"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "per_activation_bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("backend", TRAINABLE)
def test_a_model_the_converter_cannot_convert_is_one_line_naming_it(backend):
    model = per_activation()
    message = (r"^model 'per_activation_bn' \(opset 7\) cannot train its BatchNormalization: "
               r"training mode needs opset >= 14 and onnx's version converter cannot convert "
               r"the model to opset 15: Attribute spatial must have value 1$")
    with pytest.raises(ModelError, match=message) as err:
        training_graph(model)
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    exe = backends.get(backend).prepare(model)
    exe.run({"input": np.ones((2, 6), np.float32)})  # it runs; only training needs conversion
    with pytest.raises(D500Error, match=message):
        exe.trainer(make("sgd", lr=LR))
