"""Normalization operators in TensorFlow: batch (inference and training form, channels-last when
the input is), instance and Lp normalization, LRN."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ChannelsLast, norm_axis, plain, shape_list

OPS, op = registry()


def _per_channel(v, rank):
    return tf.reshape(v, [-1] + [1] * (rank - 2))


@op
def BatchNormalization(node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    training = node.attr("training_mode", 0) or (node.opset < 7 and not node.attr(
        "is_test", 0) and len(node.outputs) > 1)
    if node.opset < 9 and not node.attr("spatial", 1) and not training:
        # BN-7 spatial=0: scale, B, mean and var are (C, D1, ..., Dn), broadcast over the batch
        # axis only (statistics per activation)
        x = plain(x)
        inv = scale * tf.math.rsqrt(var + tf.cast(eps, var.dtype))
        shift = bias - mean * inv
        per_activation = shape_list(x)[1:]
        return (x * tf.cast(tf.reshape(inv, per_activation), x.dtype)
                + tf.cast(tf.reshape(shift, per_activation), x.dtype))
    if isinstance(x, ChannelsLast) and not training:
        inv = scale * tf.math.rsqrt(var + tf.cast(eps, var.dtype))
        shift = bias - mean * inv
        return ChannelsLast(x.t * tf.cast(inv, x.t.dtype) + tf.cast(shift, x.t.dtype))
    if training:  # the batch's mean and population variance; the running outputs carry no
        # gradient (as in the reference's VJP)
        momentum = node.attr("momentum", 0.9)
        if isinstance(x, ChannelsLast) and x.t.shape.rank == 4 and x.t.dtype == tf.float32:
            # TF's fused NHWC kernel (half the time of moments + normalisation, forward and
            # backward); it returns the unbiased variance, made the population one
            y, bm, bv = tf.compat.v1.nn.fused_batch_norm(
                x.t, scale, bias, epsilon=eps, data_format="NHWC", is_training=True)
            n = tf.cast(tf.size(x.t) // tf.size(bv), bv.dtype)
            bv = tf.where(n > 1, bv * ((n - 1) / n), tf.zeros_like(bv))  # n = 1: it is 0
            y = ChannelsLast(y)
        elif isinstance(x, ChannelsLast):  # N...C: per-channel vectors broadcast as they are
            r = x.t.shape.rank
            bm, bv = tf.nn.moments(x.t, list(range(r - 1)))
            y = ChannelsLast(tf.nn.batch_normalization(x.t, bm, bv, bias, scale, eps))
        else:
            r = x.shape.rank
            bm, bv = tf.nn.moments(x, [0, *range(2, r)])
            y = tf.nn.batch_normalization(x, _per_channel(bm, r), _per_channel(bv, r),
                                          _per_channel(bias, r), _per_channel(scale, r), eps)
        bm, bv = tf.stop_gradient(bm), tf.stop_gradient(bv)
        return y, mean * momentum + bm * (1 - momentum), var * momentum + bv * (1 - momentum)
    x = plain(x)
    r = x.shape.rank
    inv = scale * tf.math.rsqrt(var + tf.cast(eps, var.dtype))
    shift = bias - mean * inv
    return x * tf.cast(_per_channel(inv, r), x.dtype) + tf.cast(_per_channel(shift, r), x.dtype)


@op
def InstanceNormalization(node, x, scale, bias):
    r = x.shape.rank
    mean, var = tf.nn.moments(x, list(range(2, r)), keepdims=True)
    eps = node.attr("epsilon", 1e-5)
    return (x - mean) * tf.math.rsqrt(var + eps) * _per_channel(scale, r) + _per_channel(bias, r)


@op
def LRN(node, x):
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    if isinstance(x, ChannelsLast) and x.t.shape.rank == 4 and size % 2 and x.t.dtype == tf.float32:
        return ChannelsLast(tf.nn.local_response_normalization(
            x.t, depth_radius=(size - 1) // 2, bias=bias, alpha=alpha / size, beta=beta))
    x = plain(x)
    sq = tf.square(x)
    c = x.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = tf.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (x.shape.rank - 2))
    total = tf.add_n([padded[:, i:i + c] for i in range(size)])
    return x / (bias + alpha / size * total) ** beta


@op
def LpNormalization(node, x):
    axis = norm_axis(node.attr("axis", -1), x.shape.rank)
    p = node.attr("p", 2)
    if p == 1:
        norm = tf.reduce_sum(tf.abs(x), axis, keepdims=True)
    else:
        norm = tf.sqrt(tf.reduce_sum(tf.square(x), axis, keepdims=True))
    return tf.math.divide_no_nan(x, norm)
