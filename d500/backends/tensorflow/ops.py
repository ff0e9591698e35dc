"""The TensorFlow op table: every module's OPS (filled by d500.backends.graph.registry) combined
into one dict.

Each function is wrapped twice over:
- layout: values produced channels-last (`core.ChannelsLast`, from Conv and pooling) stay so
  through elementwise operators (their other operands moved to channels-last too) and the
  layout-aware ones (batch norm, pooling, channel concat, LRN); any other operator gets them
  back in ONNX's NC... layout, so no transpose sits between two convolutions;
- folding: a node whose inputs are all known while tracing (constants, baked shape inputs,
  static shapes) is computed right away, eagerly, and becomes a constant, so that shape
  arithmetic (Shape -> Gather -> Concat -> Reshape, as in function-expanded operators) stays
  static, which TensorFlow's own constant folding at trace time cannot promise.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

from d500.backends.layout import ELEMENTWISE
from d500.backends.tensorflow import (
    activations,
    control,
    conv,
    image,
    indexing,
    math,
    ml,
    normalization,
    pooling,
    preview_training,
    quantize,
    reduce,
    rnn,
    shape,
    signal,
    softmax,
    strings,
)
from d500.backends.tensorflow.core import ChannelsLast, broadcast_last, plain, static

NOT_FOLDED = {"If", "Loop", "Scan", "SequenceMap", "Unique"}
# operators that take ChannelsLast values themselves
LAYOUT_AWARE = {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool",
                "GlobalMaxPool", "Concat", "LRN"}
def _constant(value: Any) -> Any:
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return tf.constant(value.numpy())
    if isinstance(value, (list, tuple)):
        return type(value)(_constant(v) for v in value)
    return value


def _elementwise_last(fn, node, args):
    """fn on channels-last operands when one is channels-last and the others broadcast."""
    r = max(a.t.shape.rank for a in args if isinstance(a, ChannelsLast))
    if any(a is not None and not isinstance(a, ChannelsLast) and (
            a.shape.rank is None or a.shape.rank > r) for a in args):
        return fn(node, *[plain(a) for a in args])
    out = fn(node, *[a.t if isinstance(a, ChannelsLast) else broadcast_last(a, r)
                     for a in args])
    return ChannelsLast(out) if isinstance(out, tf.Tensor) else out


def wrapped(name: str, fn):
    """fn with layout handling and, unless excluded, constant folding."""
    aware, elementwise, fold = name in LAYOUT_AWARE, name in ELEMENTWISE, name not in NOT_FOLDED

    @functools.wraps(fn)
    def op(node, *args):
        if any(isinstance(a, ChannelsLast) for a in args):
            if aware:
                return fn(node, *args)
            if elementwise:
                return _elementwise_last(fn, node, args)
            args = tuple(plain(a) for a in args)
        if not fold or not args or any(isinstance(a, (list, tf.Variable)) for a in args):
            return fn(node, *args)
        values = []
        for a in args:
            if a is None:
                values.append(None)
                continue
            v = static(a)
            if v is None or (isinstance(v, np.ndarray) and v.size > 1 << 16):
                return fn(node, *args)
            values.append(v)
        with tf.init_scope():
            out = fn(node, *[None if v is None else tf.constant(v) for v in values])
            return _constant(plain(out))
    return op


OPS: dict = {}
for _module in (math, activations, softmax, conv, pooling, normalization, shape, indexing, reduce,
                control, image, quantize, strings, ml, preview_training, rnn, signal):
    for _key, _fn in _module.OPS.items():
        OPS[_key] = wrapped(_key.rpartition("::")[2], _fn)
