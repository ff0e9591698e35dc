"""The reference backend: the ONNX node suite, and NumPy gradients against finite differences."""

from __future__ import annotations

import backend_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from d500.backends.base import node_model
from d500.backends.reference import ReferenceBackend
from d500.builders import build
from d500.errors import UnsupportedOperator, UsageError

RNG = np.random.default_rng(42)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, size=shape)


def check_vjp(model: onnx.ModelProto, feeds: dict[str, np.ndarray], directions: int = 3,
              h: float = 1e-6, tol: float = 1e-6, every: int = 1) -> dict[str, np.ndarray]:
    """Gradients of <outputs, random seeds> agree with central differences along random
    directions, tensor by tensor."""
    rep = ReferenceBackend.prepare(model)
    outs = rep.run(feeds)
    rng = np.random.default_rng(0)
    seeds = {n: rng.normal(size=np.shape(o)) for n, o in zip(rep.output_names, outs)}
    _, grads = rep.gradients(feeds, grad_outputs=seeds)
    floats = [n for n, v in feeds.items() if np.asarray(v).dtype.kind == "f"]
    assert sorted(grads) == sorted(set(floats) | set(rep.parameter_names))

    def objective(values: dict[str, np.ndarray]) -> float:
        rep.set_parameters({k: v for k, v in values.items() if k in rep.parameter_names})
        out = rep.run({k: v for k, v in values.items() if k not in rep.parameter_names})
        return sum(float(np.sum(o * seeds[n])) for n, o in zip(rep.output_names, out))

    base = {**feeds, **rep.parameters()}
    # One tensor at a time (a joint step would cross ReLU kinks in deep nets); every `every`-th.
    for name in [n for i, n in enumerate(grads) if i % every == 0 or n in feeds]:
        for _ in range(directions):
            step = rng.normal(size=np.shape(grads[name]))
            numeric = (objective({**base, name: base[name] + h * step})
                       - objective({**base, name: base[name] - h * step})) / (2 * h)
            analytic = float(np.sum(grads[name] * step))
            assert analytic == pytest.approx(numeric, rel=tol, abs=tol), (name, numeric,
                                                                           analytic)
    rep.set_parameters({k: v for k, v in base.items() if k in rep.parameter_names})
    return grads


def op(op_type: str, feeds: dict[str, np.ndarray], opset: int = 17, outputs: int = 1,
       **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names = list(feeds)
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(outputs)], **attrs)
    return node_model(node, list(feeds.values()), opset=opset), feeds


# (model, feeds) for one node each, float64 so that finite differences are exact enough.
SINGLE_OPS = {
    "Gemm": lambda: op("Gemm", {"a": normal(4, 3), "b": normal(5, 4), "c": normal(1, 5)},
                       transA=1, transB=1, alpha=0.7, beta=1.3),
    "MatMul-batched": lambda: op("MatMul", {"a": normal(2, 1, 3, 4), "b": normal(3, 4, 5)}),
    "MatMul-vector": lambda: op("MatMul", {"a": normal(4), "b": normal(2, 4, 3)}),
    "Conv-groups-strides-pads-dilations": lambda: op(
        "Conv", {"x": normal(2, 4, 7, 8), "w": normal(6, 2, 3, 2), "b": normal(6)}, group=2,
        strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2]),
    "Conv-same-upper-1d": lambda: op("Conv", {"x": normal(1, 2, 9), "w": normal(3, 2, 4)},
                                     auto_pad="SAME_UPPER", strides=[2]),
    "Conv-depthwise": lambda: op("Conv", {"x": normal(1, 3, 5, 5), "w": normal(3, 1, 3, 3)},
                                 group=3, pads=[1, 1, 1, 1]),
    "Relu": lambda: op("Relu", {"x": normal(3, 4)}),
    "LeakyRelu": lambda: op("LeakyRelu", {"x": normal(3, 4)}, alpha=0.2),
    "Sigmoid": lambda: op("Sigmoid", {"x": normal(3, 4)}),
    "Tanh": lambda: op("Tanh", {"x": normal(3, 4)}),
    "Exp": lambda: op("Exp", {"x": normal(3, 4)}),
    "Log": lambda: op("Log", {"x": positive(3, 4)}),
    "Sqrt": lambda: op("Sqrt", {"x": positive(3, 4)}),
    "Neg": lambda: op("Neg", {"x": normal(3, 4)}),
    "Abs": lambda: op("Abs", {"x": normal(3, 4)}),
    "Reciprocal": lambda: op("Reciprocal", {"x": positive(3, 4)}),
    "Pow": lambda: op("Pow", {"x": positive(3, 4), "p": normal(4)}),
    "Clip": lambda: op("Clip", {"x": normal(3, 4), "lo": np.array(-0.5), "hi": np.array(0.7)}),
    "Add": lambda: op("Add", {"a": normal(2, 3, 4), "b": normal(3, 1)}),
    "Sub": lambda: op("Sub", {"a": normal(3, 1), "b": normal(2, 3, 4)}),
    "Mul": lambda: op("Mul", {"a": normal(2, 3, 4), "b": normal(1, 4)}),
    "Div": lambda: op("Div", {"a": normal(2, 3, 4), "b": positive(2, 1, 4)}),
    "Sum": lambda: op("Sum", {"a": normal(2, 3), "b": normal(3), "c": normal(2, 1)}),
    "Where": lambda: op("Where", {"c": RNG.random((3, 4)) > 0.5, "a": normal(3, 4),
                                  "b": normal(4)}),
    "Softmax": lambda: op("Softmax", {"x": normal(2, 3, 4)}, axis=1),
    "Softmax-opset11-coerced": lambda: op("Softmax", {"x": normal(2, 3, 4)}, opset=11, axis=1),
    "LogSoftmax": lambda: op("LogSoftmax", {"x": normal(2, 5)}),
    "MaxPool-ceil-pads": lambda: op("MaxPool", {"x": normal(2, 2, 7, 6)}, kernel_shape=[3, 3],
                                    strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1),
    "MaxPool-dilated": lambda: op("MaxPool", {"x": normal(1, 2, 8, 8)}, kernel_shape=[2, 2],
                                  dilations=[2, 2]),
    "AveragePool-exclude-pad": lambda: op("AveragePool", {"x": normal(2, 2, 6, 5)},
                                          kernel_shape=[3, 3], strides=[2, 2],
                                          pads=[1, 1, 1, 1]),
    "AveragePool-include-pad": lambda: op("AveragePool", {"x": normal(2, 2, 6, 5)},
                                          kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                                          count_include_pad=1),
    "GlobalAveragePool": lambda: op("GlobalAveragePool", {"x": normal(2, 3, 4, 5)}),
    "GlobalMaxPool": lambda: op("GlobalMaxPool", {"x": normal(2, 3, 4, 5)}),
    "BatchNormalization": lambda: op("BatchNormalization", {
        "x": normal(3, 4, 2, 3), "s": normal(4), "b": normal(4), "m": normal(4),
        "v": positive(4)}, epsilon=1e-3),
    "BatchNormalization-training": lambda: op("BatchNormalization", {
        "x": normal(3, 4, 2, 3), "s": normal(4), "b": normal(4), "m": normal(4),
        "v": positive(4)}, training_mode=1),
    "Flatten": lambda: op("Flatten", {"x": normal(2, 3, 4)}, axis=2),
    "Reshape": lambda: op("Reshape", {"x": normal(2, 3, 4), "s": np.array([4, -1])}),
    "Transpose": lambda: op("Transpose", {"x": normal(2, 3, 4)}, perm=[1, 2, 0]),
    "Concat": lambda: op("Concat", {"a": normal(2, 3), "b": normal(2, 1), "c": normal(2, 2)},
                         axis=-1),
    "Identity": lambda: op("Identity", {"x": normal(3)}),
    "Dropout-inference": lambda: op("Dropout", {"x": normal(3, 4)}),
    "ReduceMean-attr": lambda: op("ReduceMean", {"x": normal(2, 3, 4)}, axes=[0, 2],
                                  keepdims=0),
    "ReduceMean-input": lambda: op("ReduceMean", {"x": normal(2, 3, 4), "a": np.array([1])},
                                   opset=18),
    "ReduceSum-all": lambda: op("ReduceSum", {"x": normal(2, 3, 4)}, keepdims=0),
    "Slice": lambda: op("Slice", {"x": normal(5, 6), "s": np.array([4, 1]),
                                  "e": np.array([0, 6]), "a": np.array([0, 1]),
                                  "st": np.array([-2, 2])}),
    "Gather-repeats": lambda: op("Gather", {"x": normal(4, 3), "i": np.array([[0, 2], [2, 3]])}),
    "Pad-reflect": lambda: op("Pad", {"x": normal(2, 4), "p": np.array([0, 2, 1, 1])},
                              mode="reflect"),
    "Split": lambda: op("Split", {"x": normal(2, 6), "s": np.array([1, 5])}, outputs=2,
                        axis=1),
    "Expand": lambda: op("Expand", {"x": normal(3, 1), "s": np.array([2, 3, 4])}),
    "SoftmaxCrossEntropyLoss": lambda: op(
        "SoftmaxCrossEntropyLoss", {"x": normal(5, 4), "t": np.array([0, 3, 1, 1, 2])}),
    "SoftmaxCrossEntropyLoss-weights-ignore-logprob": lambda: op(
        "SoftmaxCrossEntropyLoss", {"x": normal(3, 4, 2), "t": np.array([[0, 3], [1, -1],
                                                                         [2, 2]]),
                                    "w": positive(4)}, outputs=2, ignore_index=-1),
    "SoftmaxCrossEntropyLoss-none": lambda: op(
        "SoftmaxCrossEntropyLoss", {"x": normal(3, 4), "t": np.array([0, 3, 1])},
        reduction="none"),
    "Elu": lambda: op("Elu", {"x": normal(3, 4)}, alpha=0.7),
    "Selu": lambda: op("Selu", {"x": normal(3, 4)}),
    "Celu": lambda: op("Celu", {"x": normal(3, 4)}, alpha=0.5),
    "Softplus": lambda: op("Softplus", {"x": normal(3, 4)}),
    "PRelu": lambda: op("PRelu", {"x": normal(2, 3, 4), "s": normal(3, 1)}),
    "HardSigmoid": lambda: op("HardSigmoid", {"x": 3 * normal(3, 4)}),
    "HardSwish": lambda: op("HardSwish", {"x": 3 * normal(3, 4)}),
    "Gelu-tanh": lambda: op("Gelu", {"x": normal(3, 4)}, opset=20, approximate="tanh"),
    "Sin": lambda: op("Sin", {"x": normal(3, 4)}),
    "Cos": lambda: op("Cos", {"x": normal(3, 4)}),
    "Max": lambda: op("Max", {"a": normal(3, 4), "b": normal(4)}),
    "Min": lambda: op("Min", {"a": normal(3, 4), "b": normal(4), "c": normal(3, 1)}),
    "InstanceNormalization": lambda: op("InstanceNormalization", {
        "x": normal(2, 3, 4, 2), "s": normal(3), "b": normal(3)}),
    "LRN": lambda: op("LRN", {"x": normal(2, 5, 3, 2)}, size=4, alpha=0.5, beta=0.7, bias=1.5),
    # No VJP of its own: differentiated through its ONNX function body.
    "LayerNormalization-by-function": lambda: op("LayerNormalization", {
        "x": normal(2, 3, 4), "s": normal(4), "b": normal(4)}),
}
# ReferenceEvaluator computes erf in float32: finite differences need a larger step.
LOW_PRECISION = {
    "Erf": lambda: op("Erf", {"x": normal(3, 4)}),
    "Gelu": lambda: op("Gelu", {"x": normal(3, 4)}, opset=20),
}


@pytest.mark.parametrize("case", list(SINGLE_OPS))
def test_single_op_gradient_matches_finite_differences(case):
    check_vjp(*SINGLE_OPS[case]())


@pytest.mark.parametrize("case", list(LOW_PRECISION))
def test_float32_internal_ops_gradient_matches_finite_differences(case):
    check_vjp(*LOW_PRECISION[case](), h=1e-3, tol=1e-4)


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for vi in [*out.graph.input, *out.graph.output, *out.graph.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    return out


@pytest.mark.parametrize("name", ["mlp", "lenet5", "resnet20"])
def test_builder_loss_gradient_matches_finite_differences(name):
    model = as_float64(build(name, (1, 8, 8), seed=1, loss=True))
    # ResNet's zero-initialised BatchNormalization scales put the next ReLU's inputs exactly on
    # its kink, where finite differences are meaningless: move them off it.
    for t in model.graph.initializer:
        if t.name.endswith(".scale"):
            t.CopyFrom(numpy_helper.from_array(positive(*t.dims), t.name))
    feeds = {"input": normal(3, 1, 8, 8), "labels": np.array([1, 7, 3])}
    rep = ReferenceBackend.prepare(model)
    # The loss output's gradient alone (the training step's quantity) ...
    outs, grads = rep.gradients(feeds, output="loss")
    assert outs[1].shape == () and outs[1] > 0
    assert set(grads) == set(rep.parameter_names) | {"input"}
    assert np.any(grads["input"] != 0) and np.any(grads["conv1.weight" if name != "mlp"
                                                       else "fc1.weight"] != 0)
    # ... equals the gradient with the seed 1 on loss and 0 on logits; all checked numerically.
    _, again = rep.gradients(feeds, grad_outputs={"loss": np.array(1.0)})
    for n in grads:
        np.testing.assert_allclose(again[n], grads[n])
    check_vjp(model, feeds, directions=1, every=4 if name == "resnet20" else 1)


def test_float32_gradients_keep_dtype_and_wrt_selects():
    model = build("lenet5", (1, 8, 8), seed=0, loss=True)
    rep = ReferenceBackend.prepare(model)
    x = np.random.default_rng(0).normal(size=(2, 1, 8, 8)).astype(np.float32)
    labels = np.array([3, 5])
    outs, grads = rep.gradients([x, labels], output="loss", wrt=["fc3.weight", "input"])
    assert sorted(grads) == ["fc3.weight", "input"]
    assert grads["input"].dtype == np.float32 and grads["input"].shape == x.shape
    assert outs[1] == pytest.approx(rep.run([x, labels])[1])
    with pytest.raises(UsageError, match="nosuch"):
        rep.gradients([x, labels], wrt=["nosuch"])
    with pytest.raises(UsageError, match="not an output"):
        rep.gradients([x, labels], output="fc3")


def test_parameters_can_be_read_and_set():
    model = build("mlp", (1, 8, 8), seed=0)
    rep = ReferenceBackend.prepare(model)
    x = np.ones((1, 1, 8, 8), np.float32)
    params = rep.parameters()
    assert list(params) == rep.parameter_names and len(params) == 6
    before = rep.run({"input": x})[0]
    rep.set_parameters({"fc3.bias": params["fc3.bias"] + 1})
    np.testing.assert_allclose(rep.run([x])[0], before + 1, rtol=1e-6)
    with pytest.raises(UsageError, match="not a parameter"):
        rep.set_parameters({"nosuch": np.zeros(1)})
    with pytest.raises(UsageError, match="shape"):
        rep.set_parameters({"fc3.bias": np.zeros(3)})


def test_op_without_gradient_is_named_but_only_on_the_differentiated_path():
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])
    nodes = [helper.make_node("Atan", ["x"], ["s"], name="the_atan"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    rep = ReferenceBackend.prepare(model)
    with pytest.raises(UnsupportedOperator) as err:
        rep.gradients([np.ones(3)])
    message = str(err.value)
    for part in ("'reference'", "ai.onnx::Atan", "opset 17", "'the_atan'", "no gradient"):
        assert part in message
    # Shape arithmetic off the path (Shape -> Reshape's shape input) needs no gradient.
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    _, grads = ReferenceBackend.prepare(model).gradients([np.array([-1.0, 2.0, 3.0])])
    np.testing.assert_array_equal(grads["x"], [0, 1, 1])


def test_custom_domain_operator_is_unsupported_with_its_names():
    backend_checks.unsupported_operator_names_everything(ReferenceBackend)


def test_sequences_and_optionals_come_back_as_lists_and_none():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [seq]),
                              opset_imports=[helper.make_opsetid("", 17)])
    out = ReferenceBackend.prepare(model).run([np.arange(4, dtype=np.float32)])
    assert isinstance(out[0], list) and [float(v) for v in out[0]] == [0, 1, 2, 3]


def test_lrn_sums_over_channels():
    x = np.random.default_rng(0).normal(size=(1, 4, 2, 2))  # batch 1, 4 channels
    (y,) = ReferenceBackend.run_node(helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.3,
                                                      beta=0.75, bias=1.0), [x])
    square = np.pad(x * x, [(0, 0), (1, 1), (0, 0), (0, 0)])
    window = square[:, :-2] + square[:, 1:-1] + square[:, 2:]
    np.testing.assert_allclose(y, x / (1 + 0.1 * window) ** 0.75)


def test_run_node_types_the_outputs_itself():
    split = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    _, b = ReferenceBackend.run_node(split, [np.arange(6.0).reshape(1, 6), np.array([2, 4])])
    np.testing.assert_array_equal(b, [[2, 3, 4, 5]])
    # Shape inference cannot tell this output's rank (the axes are an input): the node is run.
    mean = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)
    (y,) = ReferenceBackend.run_node(mean, [np.ones((2, 3)), np.array([1])])
    np.testing.assert_array_equal(y, [1, 1])
