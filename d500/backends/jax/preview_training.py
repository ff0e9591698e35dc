"""The ai.onnx.preview.training optimizer operators in JAX: Adagrad, Adam, Momentum (ONNX ops,
not d500's level-2 training)."""

from __future__ import annotations

import jax.numpy as jnp

from d500.backends.graph import registry

OPS, op = registry("ai.onnx.preview.training")


def _groups(values: tuple, parts: int) -> list[tuple]:
    n = len(values) // parts
    return [values[i * n:(i + 1) * n] for i in range(parts)]


@op
def Adagrad(node, rate, step, *tensors):
    decay = node.attr("decay_factor", 0.0)
    eps, norm = node.attr("epsilon", 1e-6), node.attr("norm_coefficient", 0.0)
    r = rate / (1 + step * decay)
    xs, gs, hs = _groups(tensors, 3)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = norm * x + g
        h = h + g * g
        new_x.append((x - r * g / (jnp.sqrt(h) + eps)).astype(x.dtype))
        new_h.append(h.astype(x.dtype))
    return tuple(new_x + new_h)


@op
def Adam(node, rate, step, *tensors):
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    eps, norm = node.attr("epsilon", 1e-6), node.attr("norm_coefficient", 0.0)
    post = node.attr("norm_coefficient_post", 0.0)
    t = step.astype(jnp.float64)
    r = jnp.where(t > 0, rate * jnp.sqrt(1 - beta ** t) / (1 - alpha ** jnp.where(t > 0, t, 1)),
                  rate)
    xs, gs, vs, hs = _groups(tensors, 4)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = norm * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        new_x.append(((1 - post) * (x - r * v / (jnp.sqrt(h) + eps))).astype(x.dtype))
        new_v.append(v.astype(x.dtype))
        new_h.append(h.astype(x.dtype))
    return tuple(new_x + new_v + new_h)


@op
def Momentum(node, rate, step, *tensors):
    alpha, beta = node.attr("alpha"), node.attr("beta")
    norm, nesterov = node.attr("norm_coefficient", 0.0), node.attr("mode") == "nesterov"
    beta = jnp.where(step > 0, beta, 1.0)
    xs, gs, vs = _groups(tensors, 3)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm * x + g
        v = alpha * v + beta * g
        step_dir = g + alpha * v if nesterov else v
        new_x.append((x - rate * step_dir).astype(x.dtype))
        new_v.append(v.astype(x.dtype))
    return tuple(new_x + new_v)

