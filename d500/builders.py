"""Framework-neutral ONNX builders of the reference networks (MLP, LeNet-5, ResNet-20), seeded.

Every model takes `input` (float32, NCHW, batch dimension "N") and outputs `logits` [N, classes];
with `loss=True` it also takes `labels` (int64 [N]) and outputs the scalar mean cross-entropy
`loss` after `logits`. Weights are He-normal (layers followed by ReLU) or Glorot-uniform (the
classifier), drawn from `numpy.random.default_rng(seed)`; biases are zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from d500.errors import UsageError

OPSET = 17
# The inputs the levels use: sklearn digits, MNIST, CIFAR-10.
SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar": (3, 32, 32)}


class _Graph:
    """Collects nodes and seeded initializers while a network is written down."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count: dict[str, int] = {}

    def name(self, prefix: str) -> str:
        self._count[prefix] = self._count.get(prefix, 0) + 1
        return f"{prefix}{self._count[prefix]}"

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op: str, inputs: Sequence[str], name: str, outputs: int = 1, **attrs) -> str:
        outs = [name] if outputs == 1 else [f"{name}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0]

    def he(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return self.rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)

    def glorot(self, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return self.rng.uniform(-limit, limit, size=shape)

    # -- layers ---------------------------------------------------------------
    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, pad: int = 0,
             bias: bool = True, pads: Sequence[int] | None = None) -> str:
        name = self.name("conv")
        w = self.init(f"{name}.weight", self.he((c_out, c_in, k, k), c_in * k * k))
        inputs = [x, w]
        if bias:
            inputs.append(self.init(f"{name}.bias", np.zeros(c_out)))
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=list(pads) if pads is not None else [pad] * 4)

    def gemm(self, x: str, n_in: int, n_out: int, last: bool = False) -> str:
        name = self.name("fc")
        w = (self.glorot((n_out, n_in), n_in, n_out) if last else self.he((n_out, n_in), n_in))
        return self.node("Gemm", [x, self.init(f"{name}.weight", w),
                                  self.init(f"{name}.bias", np.zeros(n_out))],
                         name, transB=1)

    def batchnorm(self, x: str, c: int, gamma: float = 1.0) -> str:
        name = self.name("bn")
        params = [self.init(f"{name}.{p}", v) for p, v in (
            ("scale", np.full(c, gamma)), ("bias", np.zeros(c)), ("mean", np.zeros(c)),
            ("var", np.ones(c)))]
        return self.node("BatchNormalization", [x, *params], name, epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], self.name("relu"))

    def maxpool(self, x: str) -> str:
        return self.node("MaxPool", [x], self.name("pool"), kernel_shape=[2, 2], strides=[2, 2])

    def flatten(self, x: str) -> str:
        return self.node("Flatten", [x], self.name("flatten"), axis=1)


def mlp(g: _Graph, x: str, shape: tuple[int, int, int], classes: int,
        hidden: Sequence[int] = (128, 64)) -> str:
    """Flatten, then Gemm+ReLU per hidden layer, then the classifier Gemm."""
    h, n = g.flatten(x), int(np.prod(shape))
    for width in hidden:
        h, n = g.relu(g.gemm(h, n, width)), width
    return g.gemm(h, n, classes, last=True)


def lenet5(g: _Graph, x: str, shape: tuple[int, int, int], classes: int) -> str:
    """LeNet-5 with ReLU and max pooling: conv5(6)-pool-conv5(16)-pool-fc120-fc84-fc.

    The 5x5 convolutions are zero-padded by 2 where the input is too small for the classic
    valid convolutions (28x28 MNIST pads the first one, as in LeCun's 32x32 framing).
    """
    c, dims = shape[0], list(shape[1:])
    pad1 = [2 if d < 32 else 0 for d in dims]
    dims = [(d + 2 * p - 4) // 2 for d, p in zip(dims, pad1)]
    pad2 = [0 if d >= 10 else 2 for d in dims]
    dims = [(d + 2 * p - 4) // 2 for d, p in zip(dims, pad2)]
    h = g.maxpool(g.relu(g.conv(x, c, 6, 5, pads=pad1 + pad1)))
    h = g.maxpool(g.relu(g.conv(h, 6, 16, 5, pads=pad2 + pad2)))
    h = g.flatten(h)
    h = g.relu(g.gemm(h, 16 * dims[0] * dims[1], 120))
    h = g.relu(g.gemm(h, 120, 84))
    return g.gemm(h, 84, classes, last=True)


def resnet20(g: _Graph, x: str, shape: tuple[int, int, int], classes: int,
             blocks: int = 3, widths: Sequence[int] = (16, 32, 64)) -> str:
    """ResNet-20 (He et al. 2016, CIFAR): conv3x3, 3 stages of 3 basic blocks, GAP, Gemm.

    Stages 2 and 3 halve the resolution; their first block's shortcut is a 1x1 convolution
    with BatchNormalization (projection shortcut). BatchNormalization is in inference form;
    the last one of each residual branch starts at scale 0, so every block starts as the
    identity (Goyal et al. 2017) and the untrained network's logits stay small.
    """
    h = g.relu(g.batchnorm(g.conv(x, shape[0], widths[0], 3, pad=1, bias=False), widths[0]))
    c = widths[0]
    for stage, width in enumerate(widths):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = g.relu(g.batchnorm(g.conv(h, c, width, 3, stride, 1, bias=False), width))
            y = g.batchnorm(g.conv(y, width, width, 3, 1, 1, bias=False), width, gamma=0.0)
            short = h
            if stride != 1 or c != width:
                short = g.batchnorm(g.conv(h, c, width, 1, stride, 0, bias=False), width)
            h = g.relu(g.node("Add", [y, short], g.name("add")))
            c = width
    h = g.flatten(g.node("GlobalAveragePool", [h], g.name("gap")))
    return g.gemm(h, c, classes, last=True)


Builder = Callable[..., str]
BUILDERS: dict[str, Builder] = {"mlp": mlp, "lenet5": lenet5, "resnet20": resnet20}
# Smallest height/width each network accepts.
_MIN_SIDE = {"mlp": 1, "lenet5": 8, "resnet20": 4}


def build(name: str, input_shape: Sequence[int] = (1, 28, 28), classes: int = 10,
          seed: int = 0, loss: bool = False) -> onnx.ModelProto:
    """The network `name` ("mlp", "lenet5", "resnet20") for CHW `input_shape`, checked."""
    if name not in BUILDERS:
        raise UsageError(f"unknown network builder '{name}' (known: {', '.join(BUILDERS)})")
    if isinstance(input_shape, str):
        if input_shape not in SHAPES:
            raise UsageError(f"unknown input shape '{input_shape}' "
                             f"(known: {', '.join(SHAPES)}, or a (C, H, W) tuple)")
        input_shape = SHAPES[input_shape]
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
        raise UsageError(f"input shape {shape} for '{name}' is not (C, H, W) with positive "
                         f"integer sizes")
    shape = tuple(int(d) for d in shape)
    if min(shape[1:]) < _MIN_SIDE[name]:
        raise UsageError(f"input shape {shape} is too small for '{name}' (height and width "
                         f"must be at least {_MIN_SIDE[name]})")
    if not isinstance(classes, (int, np.integer)) or classes < 2:
        raise UsageError(f"classes must be an integer >= 2, not {classes!r}")
    g = _Graph(seed)
    logits = BUILDERS[name](g, "input", shape, int(classes))
    g.nodes[-1].output[0] = "logits"
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *shape])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", int(classes)])]
    del logits
    if loss:
        g.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"],
                                        ["loss"], name="loss", reduction="mean"))
        inputs.append(helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]))
        outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="d500.builders")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
