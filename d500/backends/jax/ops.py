"""The JAX op table: every module's OPS (filled by d500.backends.graph.registry) combined into
one dict, each function wrapped once:

- folding: every op runs under `jax.ensure_compile_time_eval`, so what it computes from values
  known while tracing (constants, baked shape inputs, shapes) is computed right away and stays
  concrete, and shape arithmetic (Shape -> Gather -> Concat -> Reshape, as in
  function-expanded operators) stays static; what depends on a traced value is staged;
- a value an operator needs while tracing but gets only at run time (`core.NotStatic`) becomes
  an UnsupportedOperator naming the node's traced inputs, which the executable then bakes;
- layout: values produced channels-last (`core.ChannelsLast`, from Conv, batch norm and global
  pooling) stay so through elementwise operators (their other operands moved to channels-last
  too) and the layout-aware ones; any other operator gets them back in ONNX's NC... layout, and
  its outputs (a subgraph's, for control flow) are given back in it, as the TensorFlow backend
  does.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from d500.backends.jax import (
    activations,
    control,
    conv,
    detection,
    image,
    indexing,
    linalg,
    math,
    normalization,
    pooling,
    preview_training,
    reduce,
    rnn,
    shape,
    softmax,
    spectral,
    strings,
)
from d500.backends.jax.core import ChannelsLast, NotStatic, array, broadcast_last, is_tracer
from d500.backends.layout import ELEMENTWISE, plain

# operators that take ChannelsLast values themselves
LAYOUT_AWARE = {"Conv", "BatchNormalization", "GlobalAveragePool", "GlobalMaxPool"}


class NeedsStatic(Exception):
    """Raised through the walker: `names` are the node's inputs that were traced."""

    def __init__(self, error: Exception, names: list[str]):
        super().__init__(str(error))
        self.error, self.names = error, names


def _traced(x: Any) -> bool:
    return any(_traced(v) for v in x) if isinstance(x, list) else is_tracer(x)


def _jaxed(x: Any) -> Any:
    if isinstance(x, np.ndarray) and x.dtype.kind not in "OUS":
        return array(x)
    if isinstance(x, list):
        return [_jaxed(v) for v in x]
    return x


def _elementwise_last(fn, node, args):
    """fn on channels-last operands when one is channels-last and the others broadcast."""
    r = max(a.t.ndim for a in args if isinstance(a, ChannelsLast))
    if any(a is not None and not isinstance(a, ChannelsLast) and (
            not hasattr(a, "ndim") or a.ndim > r) for a in args):
        return fn(node, *[plain(a) for a in args])
    out = fn(node, *[a.t if isinstance(a, ChannelsLast) else broadcast_last(a, r)
                     for a in args])
    return ChannelsLast(out)


def _laid_out(name: str, fn):
    """fn with the layout handling the module docstring describes."""
    if name in LAYOUT_AWARE:
        return fn
    elementwise = name in ELEMENTWISE

    def op(node, *args):
        if elementwise and any(isinstance(a, ChannelsLast) for a in args):
            return _elementwise_last(fn, node, args)
        return plain(fn(node, *plain(args)))
    return op


def wrapped(name: str, fn):
    laid_out = _laid_out(name, fn)

    @functools.wraps(fn)
    def op(node, *args):
        try:
            # operations on concrete values run now (folding); those on tracers are staged
            with jax.ensure_compile_time_eval():
                return laid_out(node, *[_jaxed(a) for a in args])
        except NotStatic as err:
            traced = [n for n, a in zip(node.inputs, args) if n and _traced(a)]
            named = [n for n, a in zip(node.inputs, args) if n and a is err.value]
            traced = named or traced
            raise NeedsStatic(node.unsupported(
                f"the {err} must be known when the graph is traced"), traced) from None
    return op


OPS: dict = {}
for _module in (math, activations, softmax, conv, pooling, normalization, shape, indexing,
                reduce, linalg, control, image, rnn, preview_training,
                strings, spectral, detection):
    for _key, _fn in _module.OPS.items():
        OPS[_key] = wrapped(_key.rpartition("::")[2], _fn)
