"""String ops and the classic ai.onnx.ml ops for JAX: the shared NumPy ones, whose inputs must be
known while tracing (the executable bakes them), plus those that stay on JAX arrays."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, static


def _host(x) -> np.ndarray:
    """A value as NumPy; it must be known while tracing."""
    if isinstance(x, np.ndarray):
        return x
    value = static(x)
    if value is None:
        raise NotStatic("input", x)
    return value


def _device(node, array, like=None):
    value = jnp.asarray(array)
    return value if like is None else value.astype(like.dtype)


OPS, op = registry()
OPS.update(host_ops.table(host_ops.Io(_host, _device)))


def _ml(name: str):
    return lambda fn: OPS.setdefault(f"ai.onnx.ml::{name}", fn)


@_ml("Binarizer")
def Binarizer(node, x):
    return (x > node.attr("threshold", 0.0)).astype(x.dtype)


@_ml("ArrayFeatureExtractor")
def ArrayFeatureExtractor(node, x, indices):
    if isinstance(x, np.ndarray):
        return np.take(x, _host(indices).reshape(-1), axis=-1)
    picked = jnp.take(x, indices.reshape(-1).astype(jnp.int64), axis=-1)
    return picked.reshape(1, -1) if x.ndim == 1 else picked
