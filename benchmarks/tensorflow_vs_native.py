"""d500's TensorFlow backend against native TensorFlow/Keras on the same ResNet-style CNN.

A ResNet-style CNN is built natively in Keras (channels-last, as TensorFlow's CPU kernels want)
and the same network is written as ONNX with onnx.helper (channels-first, as ONNX is) from the
Keras weights; d500's TensorFlow backend prepares it. Both run on the same input data (NHWC for
Keras, its NCHW transpose for ONNX) in alternating repetitions: inference, and a training step's
forward+backward (gradients of the summed logits with respect to every parameter and the input;
batch norm in inference mode in both, as in the ONNX graph). It prints the throughput ratio
d500/native (median over repetitions, with the quartiles of the per-repetition ratios) at the
module level (tf.function over tensors, both sides) and at the Executable API (NumPy in and out;
the native side then also returns NumPy arrays).

What d500 does on top, by the ONNX contract rather than by choice: its parameters are the ONNX
float initializers, so its gradients also cover batch norm's running mean and variance (Keras
keeps them non-trainable: a superset of a few per-channel vectors); they are held in ONNX layout
(OIHW kernels), so every step transposes each kernel to TensorFlow's HWIO and each kernel
gradient back; and the NCHW input is transposed to channels-last (its gradient back).

    .venv/bin/python benchmarks/tensorflow_vs_native.py [--batch 32] [--repetitions 15]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
from _args import repetitions
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from ratio import agree, compare  # noqa: E402

WIDTHS = (16, 32, 64)
EPS = 1e-5


def keras_resnet(classes: int = 10) -> tf.keras.Model:
    """ResNet-14 style for 32x32x3: a stem, three stages of two basic blocks, pool, classifier."""
    layers = tf.keras.layers

    def conv_bn(x, width, kernel, stride, name):
        x = layers.Conv2D(width, kernel, stride, padding="same", use_bias=False,
                          name=f"{name}_conv")(x)
        return layers.BatchNormalization(epsilon=EPS, name=f"{name}_bn")(x)

    def block(x, width, stride, name):
        y = layers.ReLU()(conv_bn(x, width, 3, stride, f"{name}_1"))
        y = conv_bn(y, width, 3, 1, f"{name}_2")
        shortcut = x
        if stride != 1 or x.shape[-1] != width:
            shortcut = conv_bn(x, width, 1, stride, f"{name}_sc")
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = tf.keras.Input((32, 32, 3))
    x = layers.ReLU()(conv_bn(inputs, WIDTHS[0], 3, 1, "stem"))
    for i, width in enumerate(WIDTHS):
        x = block(x, width, 1 if i == 0 else 2, f"s{i}a")
        x = block(x, width, 1, f"s{i}b")
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, layers.Dense(classes, name="fc")(x))


def onnx_resnet(model: tf.keras.Model) -> onnx.ModelProto:
    """The same network in ONNX (NCHW), with the Keras model's weights."""
    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def conv_bn(x, name):
        conv = model.get_layer(f"{name}_conv")
        bn = model.get_layer(f"{name}_bn")
        kernel = conv.kernel.numpy()  # HWIO -> OIHW
        k, stride = kernel.shape[0], conv.strides[0]
        # TF "same" padding puts the odd pixel at the end: pads (0, 1) for 3x3 stride 2
        total = max(k - stride, 0)
        pads = [total // 2, total // 2, total - total // 2, total - total // 2]
        w = init(f"{name}_w", kernel.transpose(3, 2, 0, 1))
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}_c"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=pads))
        params = [init(f"{name}_{p}", v.numpy()) for p, v in zip(
            ("scale", "bias", "mean", "var"),
            (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance))]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}_c", *params],
                                      [f"{name}_y"], epsilon=EPS))
        return f"{name}_y"

    def relu(x, name):
        nodes.append(helper.make_node("Relu", [x], [name]))
        return name

    def block(x, cin, width, stride, name):
        y = relu(conv_bn(x, f"{name}_1"), f"{name}_r1")
        y = conv_bn(y, f"{name}_2")
        shortcut = conv_bn(x, f"{name}_sc") if stride != 1 or cin != width else x
        nodes.append(helper.make_node("Add", [y, shortcut], [f"{name}_sum"]))
        return relu(f"{name}_sum", f"{name}_out")

    x, cin = relu(conv_bn("input", "stem"), "stem_out"), WIDTHS[0]
    for i, width in enumerate(WIDTHS):
        x = block(x, cin, width, 1 if i == 0 else 2, f"s{i}a")
        x = block(x, width, width, 1, f"s{i}b")
        cin = width
    fc = model.get_layer("fc")
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", init("fc_w", fc.kernel.numpy()),
                                        init("fc_b", fc.bias.numpy())], ["logits"])]
    graph = helper.make_graph(
        nodes, "resnet14", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                          ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build(batch: int, seed: int = 0):
    """The Keras model (trained-looking BN statistics), the same network in ONNX, an NHWC input."""
    tf.keras.utils.set_random_seed(seed)
    model = keras_resnet()
    rng = np.random.default_rng(seed)
    for layer in model.layers:  # non-trivial statistics, so batch norm is not an identity
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.uniform(-0.1, 0.1, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            layer.beta.assign(rng.uniform(-0.1, 0.1, c).astype(np.float32))
    x = rng.standard_normal((batch, 32, 32, 3)).astype(np.float32)
    return model, onnx_resnet(model), x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=5, help="calls per timed repetition")
    args = parser.parse_args(argv)
    from d500.backends.tensorflow import TensorFlowBackend

    model, onnx_model, x_nhwc = build(args.batch)
    rep = TensorFlowBackend.prepare(onnx_model)
    module = rep.native
    x_nchw = np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))
    xt, xt_nchw = tf.constant(x_nhwc), tf.constant(x_nchw)

    native_fn = tf.function(lambda v: model(v, training=False))
    expected = native_fn(xt).numpy()
    if not agree(f"tensorflow {tf.__version__}, batch {args.batch}, "
                 f"{len(onnx_model.graph.node)} ONNX nodes", rep.run([x_nchw])[0], expected):
        return 1

    native_vars = model.trainable_variables
    d500_vars = list(module.params.values())

    @tf.function
    def native_grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(model(v, training=False))
        return tape.gradient(loss, [*native_vars, v])

    @tf.function
    def d500_grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(module([v])[0])
        return tape.gradient(loss, [*d500_vars, v])

    d500_infer = tf.function(lambda v: module([v])[0])
    cases = {
        "inference (tf.function)": (lambda: d500_infer(xt_nchw), lambda: native_fn(xt)),
        "forward+backward (tf.function)": (lambda: d500_grad(xt_nchw), lambda: native_grad(xt)),
        "inference (Executable.run, NumPy)": (
            lambda: rep.run([x_nchw]), lambda: native_fn(tf.constant(x_nhwc)).numpy()),
        "forward+backward (gradients, NumPy)": (
            lambda: rep.gradients([x_nchw]),
            lambda: [g.numpy() for g in native_grad(tf.constant(x_nhwc))]),
    }
    compare(cases, args.repetitions, args.number, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
