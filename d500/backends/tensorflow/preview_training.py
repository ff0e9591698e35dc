"""The ai.onnx.preview.training optimizer operators in TensorFlow: Adagrad, Momentum, Adam (ONNX
ops, not d500's level-2 training)."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry

OPS, op = registry("ai.onnx.preview.training")


def _groups(inputs, per):
    r, t, rest = inputs[0], inputs[1], inputs[2:]
    n = len(rest) // per
    return r, t, [[rest[k * n + i] for k in range(per)] for i in range(n)], n


@op
def Adagrad(node, *inputs):
    r, t, groups, _ = _groups(inputs, 3)
    decay, eps = node.attr("decay_factor", 0.0), node.attr("epsilon", 0.0)
    norm = node.attr("norm_coefficient", 0.0)
    xs, hs = [], []
    for x, g, h in groups:
        rate = tf.cast(r / (1 + tf.cast(t, r.dtype) * decay), x.dtype)
        g = norm * x + g
        h_new = h + g * g
        xs.append(x - rate * g / (tf.sqrt(h_new) + eps))
        hs.append(h_new)
    return tuple(xs + hs)


@op
def Momentum(node, *inputs):
    r, t, groups, _ = _groups(inputs, 3)
    alpha, beta = node.attr("alpha"), node.attr("beta")
    norm, nesterov = node.attr("norm_coefficient"), node.attr("mode") == "nesterov"
    xs, vs = [], []
    for x, g, v in groups:
        g = norm * x + g
        b = tf.where(t > 0, tf.cast(beta, x.dtype), tf.cast(1, x.dtype))
        v_new = alpha * v + b * g
        rate = tf.cast(r, x.dtype)
        xs.append(x - rate * (g + alpha * v_new) if nesterov else x - rate * v_new)
        vs.append(v_new)
    return tuple(xs + vs)


@op
def Adam(node, *inputs):
    r, t, groups, _ = _groups(inputs, 4)
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    eps = node.attr("epsilon", 0.0)
    norm, post = node.attr("norm_coefficient", 0.0), node.attr("norm_coefficient_post", 0.0)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        g = norm * x + g
        v_new = alpha * v + (1 - alpha) * g
        h_new = beta * h + (1 - beta) * g * g
        tf_ = tf.cast(t, tf.float64)
        rate = tf.where(t > 0, tf.cast(r, tf.float64) * tf.sqrt(1 - beta ** tf_) /
                        (1 - alpha ** tf_), tf.cast(r, tf.float64))
        x_new = x - tf.cast(rate, x.dtype) * (v_new / (tf.sqrt(h_new) + eps))
        xs.append((1 - post) * x_new)
        vs.append(v_new)
        hs.append(h_new)
    return tuple(xs + vs + hs)
