"""Framework-neutral ONNX builders of the reference networks (MLP, LeNet-5, ResNet-20, a
decoder-only transformer, a BERT-shaped encoder), seeded.

Every image model takes `input` (float32, NCHW, batch dimension "N") and outputs `logits`
[N, classes]; with `loss=True` it also takes `labels` (int64 [N]) and outputs the scalar mean
cross-entropy `loss` after `logits`. Weights are He-normal (layers followed by ReLU) or
Glorot-uniform (the classifier), drawn from `numpy.random.default_rng(seed)`; biases are zero.

The language models (`transformer`, `encoder`) take `input` (int64 tokens [N, T]) and output
`logits` [N, T, vocab]; with `loss=True` they also take `labels` (the tokens to predict, for the
transformer the next ones, int64 [N, T]) and output `loss`, the mean cross-entropy over all N * T
positions (nats: the transformer's log-perplexity).
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

    def const(self, name: str, value: np.ndarray) -> str:
        """An integer initializer (a shape): not a parameter."""
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def linear(self, x: str, n_in: int, n_out: int, std: float) -> str:
        """x @ W + b, W normal(0, std) [n_in, n_out] (x of any rank: MatMul broadcasts)."""
        name = self.name("linear")
        w = self.init(f"{name}.weight", self.rng.normal(0.0, std, (n_in, n_out)))
        y = self.node("MatMul", [x, w], f"{name}.matmul")
        return self.node("Add", [y, self.init(f"{name}.bias", np.zeros(n_out))], name)

    def layernorm(self, x: str, width: int) -> str:
        name = self.name("ln")
        return self.node("LayerNormalization", [
            x, self.init(f"{name}.scale", np.ones(width)),
            self.init(f"{name}.bias", np.zeros(width))], name, axis=-1, epsilon=1e-5)

    def flatten(self, x: str) -> str:
        return self.node("Flatten", [x], self.name("flatten"), axis=1)

    def attention_constants(self, width: int, heads: int) -> None:
        """The shapes that split and merge `heads` heads, and the scale 1/sqrt(head), once per
        network (`attention` reads them by name)."""
        if width % heads:
            raise UsageError(f"width {width} is not a multiple of heads {heads}")
        head = width // heads
        self.const("heads.shape", np.array([0, 0, heads, head], np.int64))
        self.const("merge.shape", np.array([0, 0, width], np.int64))
        self.node("Constant", [], "attention.scale",
                  value=numpy_helper.from_array(np.array(1 / np.sqrt(head), np.float32)))

    def attention(self, x: str, width: int, std: float, out_std: float,
                  mask: str | None = None) -> str:
        """Multi-head scaled dot-product self-attention over [N, T, width] (Vaswani et al. 2017):
        Q, K, V projections (normal(0, std)), softmax(Q K^T / sqrt(head) + mask) V per head, the
        output projection (normal(0, out_std)); biases zero."""
        q, k, v = (self.node("Reshape", [self.linear(x, width, width, std), "heads.shape"],
                             self.name("split")) for _ in range(3))
        q = self.node("Transpose", [q], self.name("q"), perm=[0, 2, 1, 3])  # [N, H, T, head]
        k = self.node("Transpose", [k], self.name("k"), perm=[0, 2, 3, 1])  # [N, H, head, T]
        v = self.node("Transpose", [v], self.name("v"), perm=[0, 2, 1, 3])
        s = self.node("Mul", [self.node("MatMul", [q, k], self.name("scores")), "attention.scale"],
                      self.name("scaled"))
        if mask is not None:
            s = self.node("Add", [s, mask], self.name("masked"))
        p = self.node("Softmax", [s], self.name("attention"), axis=-1)
        o = self.node("Transpose", [self.node("MatMul", [p, v], self.name("mix"))],
                      self.name("heads"), perm=[0, 2, 1, 3])
        return self.linear(self.node("Reshape", [o, "merge.shape"], self.name("merge")),
                           width, width, out_std)


def transformer(g: _Graph, x: str, context: int, vocab: int, layers: int = 2, width: int = 64,
                heads: int = 4, tied: bool = True) -> str:
    """A decoder-only transformer (GPT-2's layout, Radford et al. 2019): token and position
    embeddings, then per layer pre-LayerNorm causal self-attention and a pre-LayerNorm GELU MLP
    (4x wide), each added to the residual stream; a final LayerNorm and the output projection,
    the token embedding transposed (`tied`) or a matrix of its own. Weights are normal(0, 0.02),
    the projections into the residual stream 0.02 / sqrt(2 * layers); biases zero, LayerNorm
    scales one."""
    std, out_std = 0.02, 0.02 / np.sqrt(2 * layers)
    wte = g.init("wte", g.rng.normal(0, std, (vocab, width)))
    h = g.node("Add", [g.node("Gather", [wte, x], "embed"),
                       g.init("wpe", g.rng.normal(0, std / 2, (context, width)))], "position")
    g.attention_constants(width, heads)
    mask = g.node("Constant", [], "causal.mask", value=numpy_helper.from_array(
        np.triu(np.full((context, context), -1e9, np.float32), k=1)))
    for _ in range(layers):
        o = g.attention(g.layernorm(h, width), width, std, out_std, mask)
        h = g.node("Add", [h, o], g.name("residual"))
        m = g.node("Gelu", [g.linear(g.layernorm(h, width), width, 4 * width, std)],
                   g.name("gelu"))
        h = g.node("Add", [h, g.linear(m, 4 * width, width, out_std)], g.name("residual"))
    h = g.layernorm(h, width)
    if tied:
        return g.node("MatMul", [h, g.node("Transpose", [wte], "unembed", perm=[1, 0])],
                      "output")
    head_w = g.init("output.weight", g.rng.normal(0, std, (width, vocab)))
    return g.node("MatMul", [h, head_w], "output")


def encoder(g: _Graph, x: str, context: int, vocab: int, layers: int = 12, width: int = 768,
            heads: int = 12, tied: bool = True) -> str:
    """A bidirectional encoder with BERT's layout (Devlin et al. 2019; BERT-base is 12 layers,
    width 768, 12 heads, a 4x wide GELU (erf) feed-forward): token and position embeddings and
    their LayerNorm, then per layer unmasked self-attention and the feed-forward network, each
    added to the residual stream and followed by a LayerNorm (post-LN), then the output
    projection, the token embedding transposed (`tied`, as BERT's masked-LM decoder) or a matrix
    of its own. Weights normal(0, 0.02) (BERT's initializer range), biases zero, LayerNorm
    scales one. Every token sees every other: for level 1's timings, not next-token training."""
    std = 0.02
    wte = g.init("wte", g.rng.normal(0, std, (vocab, width)))
    h = g.node("Add", [g.node("Gather", [wte, x], "embed"),
                       g.init("wpe", g.rng.normal(0, std, (context, width)))], "position")
    h = g.layernorm(h, width)
    g.attention_constants(width, heads)
    for _ in range(layers):
        h = g.layernorm(g.node("Add", [h, g.attention(h, width, std, std)], g.name("residual")),
                        width)
        m = g.node("Gelu", [g.linear(h, width, 4 * width, std)], g.name("gelu"))
        h = g.layernorm(g.node("Add", [h, g.linear(m, 4 * width, width, std)],
                               g.name("residual")), width)
    if tied:
        return g.node("MatMul", [h, g.node("Transpose", [wte], "unembed", perm=[1, 0])],
                      "output")
    return g.node("MatMul", [h, g.init("output.weight", g.rng.normal(0, std, (width, vocab)))],
                  "output")


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
# Builders over token sequences; CAUSAL: those whose position t sees no later token (next-token
# training needs one).
LANGUAGE = {"transformer": transformer, "encoder": encoder}
CAUSAL = ("transformer",)
LM_OPSET = 20  # Gelu


def build_lm(name: str, context: int, vocab: int, seed: int = 0, loss: bool = False,
             **options) -> onnx.ModelProto:
    """The language model `name` ("transformer", "encoder") over windows of `context` tokens of a
    vocabulary of `vocab`, checked; `options`: the builder's (layers, width, heads, tied)."""
    if name not in LANGUAGE:
        raise UsageError(f"unknown language-model builder '{name}' (known: "
                         f"{', '.join(LANGUAGE)})")
    for what, value, lowest in (("context", context, 1), ("vocab", vocab, 2),
                                *((k, v, 1) for k, v in options.items() if k != "tied")):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lowest:
            raise UsageError(f"{name}: {what} must be an integer >= {lowest}, not {value!r}")
    g = _Graph(seed)
    LANGUAGE[name](g, "input", int(context), int(vocab), **options)
    g.nodes[-1].output[0] = "logits"
    inputs = [helper.make_tensor_value_info("input", TensorProto.INT64, ["N", int(context)])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["N", int(context), int(vocab)])]
    if loss:
        flat = g.const("logits.shape", np.array([-1, vocab], np.int64))
        rows = g.const("labels.shape", np.array([-1], np.int64))
        g.nodes.append(helper.make_node("Reshape", ["logits", flat], ["logits.flat"],
                                        name="logits.flat"))
        g.nodes.append(helper.make_node("Reshape", ["labels", rows], ["labels.flat"],
                                        name="labels.flat"))
        g.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits.flat", "labels.flat"],
                                        ["loss"], name="loss", reduction="mean"))
        inputs.append(helper.make_tensor_value_info("labels", TensorProto.INT64,
                                                    ["N", int(context)]))
        outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return _checked(g, name, inputs, outputs, LM_OPSET, ir_version=9)
# Smallest height/width each network accepts.
_MIN_SIDE = {"mlp": 1, "lenet5": 8, "resnet20": 4}


def build(name: str, input_shape: Sequence[int] = (1, 28, 28), classes: int = 10,
          seed: int = 0, loss: bool = False, **options) -> onnx.ModelProto:
    """The network `name` ("mlp", "lenet5", "resnet20") for CHW `input_shape`, checked;
    `options`: the builder's (an mlp's `hidden` widths)."""
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
    logits = BUILDERS[name](g, "input", shape, int(classes), **options)
    g.nodes[-1].output[0] = "logits"
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *shape])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", int(classes)])]
    del logits
    if loss:
        g.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"],
                                        ["loss"], name="loss", reduction="mean"))
        inputs.append(helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]))
        outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return _checked(g, name, inputs, outputs, OPSET, ir_version=8)


def _checked(g: _Graph, name: str, inputs: list, outputs: list, opset: int, ir_version: int
             ) -> onnx.ModelProto:
    """The graph written into `g` as a model of `opset`, checked by onnx (full check)."""
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="d500.builders")
    model.ir_version = ir_version
    onnx.checker.check_model(model, full_check=True)
    return model
