"""Activation operators in TensorFlow (Relu, Sigmoid, Gelu, ...) and Dropout (inference mode)."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry

OPS, op = registry()


def _c(x, value):
    return tf.constant(value, x.dtype)


@op
def Relu(node, x):
    return tf.nn.relu(x)


@op
def LeakyRelu(node, x):
    return tf.where(x >= 0, x, x * _c(x, node.attr("alpha", 0.01)))


@op
def PRelu(node, x, slope):
    return tf.where(x >= 0, x, x * slope)


@op
def Elu(node, x):
    alpha = _c(x, node.attr("alpha", 1.0))
    return tf.where(x > 0, x, alpha * (tf.exp(x) - 1))


@op
def Selu(node, x):
    alpha = _c(x, node.attr("alpha", 1.67326319217681884765625))
    gamma = _c(x, node.attr("gamma", 1.05070102214813232421875))
    return gamma * tf.where(x > 0, x, alpha * (tf.exp(x) - 1))


@op
def Celu(node, x):
    alpha = _c(x, node.attr("alpha", 1.0))
    return tf.maximum(x, 0) + tf.minimum(_c(x, 0), alpha * (tf.exp(x / alpha) - 1))


@op
def ThresholdedRelu(node, x):
    return tf.where(x > _c(x, node.attr("alpha", 1.0)), x, tf.zeros_like(x))


@op
def Sigmoid(node, x):
    return tf.sigmoid(x)


@op
def HardSigmoid(node, x):
    alpha, beta = _c(x, node.attr("alpha", 0.2)), _c(x, node.attr("beta", 0.5))
    return tf.clip_by_value(alpha * x + beta, _c(x, 0), _c(x, 1))


@op
def HardSwish(node, x):
    return x * tf.clip_by_value(x / 6 + _c(x, 0.5), _c(x, 0), _c(x, 1))


@op
def Softplus(node, x):
    return tf.nn.softplus(x)


@op
def Softsign(node, x):
    return x / (1 + tf.abs(x))


@op
def Mish(node, x):
    return x * tf.tanh(tf.nn.softplus(x))


@op
def Gelu(node, x):
    return tf.nn.gelu(x, approximate=node.attr("approximate", "none") == "tanh")


@op
def Swish(node, x):
    return x * tf.sigmoid(x * _c(x, node.attr("alpha", 1.0)))


@op
def Shrink(node, x):
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    xf = tf.cast(x, tf.float64)
    y = tf.where(xf < -lambd, xf + bias, tf.where(xf > lambd, xf - bias, tf.zeros_like(xf)))
    return tf.cast(y, x.dtype)


@op
def Dropout(node, x, ratio=None, training=None):
    from d500.backends.tensorflow.core import static
    if training is not None and bool(static(training)) and (
            ratio is None or float(static(ratio)) > 0):
        raise node.unsupported("training-mode Dropout is random; d500 runs it in inference mode")
    return x, tf.ones_like(x, tf.bool)
