"""The ai.onnx.preview.training optimizer operators in JAX: Adagrad, Adam, Momentum (ONNX ops,
not d500's level-2 training), the formulas of d500/backends/preview_training.py."""

from __future__ import annotations

import jax.numpy as jnp

from d500.backends.graph import registry
from d500.backends.preview_training import Arrays, register

OPS, op = registry("ai.onnx.preview.training")
register(op, Arrays(sqrt=jnp.sqrt, where=jnp.where,
                    wide=lambda t: jnp.asarray(t).astype(jnp.float64),
                    cast=lambda x, like: x.astype(like.dtype)))
