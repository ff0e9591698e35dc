"""The softmax family in TensorFlow (Softmax, LogSoftmax, Hardmax) and the losses on
log-probabilities (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import norm_axis

OPS, op = registry()


def _softmax_like(fn, node, x):
    if x.dtype in (tf.float16, tf.bfloat16):  # in float32, rounded once at the end
        return tf.cast(_softmax_like(fn, node, tf.cast(x, tf.float32)), x.dtype)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if node.opset >= 13:
        return fn(x, norm_axis(axis, x.shape.rank))
    shape = tf.shape(x)
    axis = norm_axis(axis, x.shape.rank)
    flat = tf.reshape(x, [tf.reduce_prod(shape[:axis]), -1])
    return tf.reshape(fn(flat, 1), shape)


def _hardmax(x, axis):
    return tf.one_hot(tf.argmax(x, axis), tf.shape(x)[axis], axis=axis, dtype=x.dtype)


@op
def Softmax(node, x):
    return _softmax_like(lambda v, a: tf.nn.softmax(v, axis=a), node, x)


@op
def LogSoftmax(node, x):
    return _softmax_like(lambda v, a: tf.nn.log_softmax(v, axis=a), node, x)


@op
def Hardmax(node, x):
    return _softmax_like(_hardmax, node, x)


@op
def NegativeLogLikelihoodLoss(node, x, target, weight=None):
    r = x.shape.rank
    xt = tf.transpose(x, [0, *range(2, r), 1])  # classes last
    ignore = node.attr("ignore_index")
    t = tf.cast(target, tf.int64)
    valid = tf.ones_like(t, tf.bool) if ignore is None else tf.not_equal(t, ignore)
    safe = tf.where(valid, t, tf.zeros_like(t))
    picked = tf.gather(xt, safe, batch_dims=r - 1)
    w = tf.ones_like(picked) if weight is None else tf.gather(weight, safe)
    w = tf.where(valid, w, tf.zeros_like(w))
    loss = -picked * w
    reduction = node.attr("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return tf.reduce_sum(loss)
    return tf.reduce_sum(loss) / tf.reduce_sum(w)


@op
def SoftmaxCrossEntropyLoss(node, x, target, weight=None):
    """Unweighted, without ignore_index, on [N, C]: TensorFlow's fused sparse softmax cross
    entropy (one kernel each way, any batch size while tracing); else log-softmax and NLL."""
    reduction = node.attr("reduction", "mean")
    want_log_prob = len(node.outputs) > 1 and bool(node.outputs[1])
    if (weight is None and node.attr("ignore_index") is None and x.shape.rank == 2
            and x.dtype in (tf.float32, tf.float64) and not want_log_prob):
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(target, tf.int64), x)
        if reduction == "none":
            return loss
        return tf.reduce_sum(loss) if reduction == "sum" else tf.reduce_mean(loss)
    log_prob = tf.nn.log_softmax(x, axis=1)
    loss = NegativeLogLikelihoodLoss(node, log_prob, target, weight)
    return (loss, log_prob) if want_log_prob else loss
