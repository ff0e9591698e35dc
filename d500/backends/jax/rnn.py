"""Recurrent JAX ops, unrolled while tracing: RNN, GRU, LSTM (the shared `recurrent` module over
JAX's primitives; its matmuls at the highest precision)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from d500.backends import recurrent

KIT = recurrent.Kit(
    matmul=functools.partial(jnp.matmul, precision="highest"), where=jnp.where, stack=jnp.stack,
    zeros=lambda like, shape: jnp.zeros(shape, like.dtype), permute=jnp.transpose,
    split=jnp.split, clip=jnp.clip, int64=lambda x: x.astype(jnp.int64), abs=jnp.abs,
    sigmoid=jax.nn.sigmoid, tanh=jnp.tanh, relu=jax.nn.relu, softplus=jax.nn.softplus,
    leaky_relu=jax.nn.leaky_relu, elu=jax.nn.elu)
OPS = recurrent.table(KIT)
