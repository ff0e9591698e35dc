"""Activation functions in JAX (and inference-mode Dropout)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d500.backends.graph import registry
from d500.backends.jax.core import like, static, with_kernel

OPS, op = registry()


@op
def Relu(node, x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@op
def LeakyRelu(node, x):
    alpha = node.attr("alpha", 0.01)
    return jnp.where(x >= 0, x, x * like(alpha, x))


@op
def PRelu(node, x, slope):
    return jnp.where(x >= 0, x, x * slope.astype(x.dtype))


@op
def Elu(node, x):
    alpha = like(node.attr("alpha", 1.0), x)
    return jnp.where(x > 0, x, alpha * jnp.expm1(x))


@op
def Selu(node, x):
    alpha = like(node.attr("alpha", 1.67326319217681884765625), x)
    gamma = like(node.attr("gamma", 1.05070102214813232421875), x)
    return gamma * jnp.where(x > 0, x, alpha * jnp.expm1(x))


@op
def Celu(node, x):
    alpha = like(node.attr("alpha", 1.0), x)
    return jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(x / alpha))


@op
def Sigmoid(node, x):
    return with_kernel(jax.nn.sigmoid, x)


@op
def HardSigmoid(node, x):
    alpha, beta = like(node.attr("alpha", 0.2), x), like(node.attr("beta", 0.5), x)
    return jnp.clip(alpha * x + beta, like(0, x), like(1, x))


@op
def HardSwish(node, x):
    return x * jnp.clip(x / like(6, x) + like(0.5, x), like(0, x), like(1, x))


@op
def Tanh(node, x):
    return with_kernel(jnp.tanh, x)


@op
def Softplus(node, x):
    return with_kernel(jnp.logaddexp, x, jnp.zeros((), x.dtype))


@op
def Softsign(node, x):
    return x / (1 + jnp.abs(x))


@op
def ThresholdedRelu(node, x):
    return jnp.where(x > like(node.attr("alpha", 1.0), x), x, jnp.zeros((), x.dtype))


@op
def Gelu(node, x):
    return jax.nn.gelu(x, approximate=node.attr("approximate", "none") == "tanh")


@op
def Mish(node, x):
    return x * jnp.tanh(jnp.logaddexp(x, jnp.zeros((), x.dtype)))


@op
def Swish(node, x):
    return x * jax.nn.sigmoid(like(node.attr("alpha", 1.0), x) * x)


@op
def Shrink(node, x):
    lambd, bias = like(node.attr("lambd", 0.5), x), like(node.attr("bias", 0.0), x)
    return jnp.where(x < -lambd, x + bias, jnp.where(x > lambd, x - bias, jnp.zeros((), x.dtype)))


@op
def Dropout(node, x, ratio=None, training_mode=None):
    training = static(training_mode)
    if training is not None and bool(training) and node.opset >= 12:
        value = static(ratio)
        if value is None or float(value) != 0:
            raise node.unsupported("training-mode Dropout (a random output) is not computed")
    if len(node.outputs) > 1 and node.outputs[1]:
        return x, jnp.ones(x.shape, bool)
    return x
