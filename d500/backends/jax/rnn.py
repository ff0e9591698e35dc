"""Recurrent JAX ops, unrolled while tracing: RNN, GRU, LSTM (ONNX gate orders, directions,
layouts, sequence lengths)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d500.backends.graph import registry

OPS, op = registry()


def _activation(name: str, alpha: float | None, beta: float | None):
    """An ONNX RNN activation by name, with its alpha/beta."""
    name = name.lower()
    if name == "sigmoid":
        return jax.nn.sigmoid
    if name == "tanh":
        return jnp.tanh
    if name == "relu":
        return jax.nn.relu
    if name == "affine":
        return lambda x: alpha * x + beta
    if name == "leakyrelu":
        return lambda x: jax.nn.leaky_relu(x, alpha if alpha is not None else 0.01)
    if name == "thresholdedrelu":
        return lambda x: jnp.where(x > (alpha if alpha is not None else 1.0), x, 0 * x)
    if name == "scaledtanh":
        return lambda x: alpha * jnp.tanh(beta * x)
    if name == "hardsigmoid":
        a, b = alpha if alpha is not None else 0.2, beta if beta is not None else 0.5
        return lambda x: jnp.clip(a * x + b, 0, 1)
    if name == "elu":
        return lambda x: jax.nn.elu(x, alpha if alpha is not None else 1.0)
    if name == "softsign":
        return lambda x: x / (1 + jnp.abs(x))
    if name == "softplus":
        return jax.nn.softplus
    raise ValueError(f"unknown RNN activation {name}")


_NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}


def _activations(node, defaults: list[str], directions: int) -> list[list]:
    names = node.attr("activations") or defaults * directions
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    fns = []
    for name in names:
        low = name.lower()
        a = alphas.pop(0) if low in _NEEDS_ALPHA and alphas else None
        b = betas.pop(0) if low in _NEEDS_BETA and betas else None
        fns.append(_activation(name, a, b))
    n = len(defaults)
    return [fns[d * n:(d + 1) * n] for d in range(directions)]


def _recurrence(node, x, w, r, b, lens, h0, c0, p, gates: int, defaults: list[str], cell):
    """Run every direction; return (Y, Y_h, Y_c) in the node's layout."""
    layout = node.attr("layout", 0)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(c0, 0, 1)
    steps, batch, _ = x.shape
    hidden = node.attr("hidden_size") or r.shape[-1]
    direction = node.attr("direction", "forward")
    directions = 2 if direction == "bidirectional" else 1
    acts = _activations(node, defaults, directions)
    clip = node.attr("clip")
    if lens is not None:
        lens = lens.astype(jnp.int64).reshape(1, batch, 1)
    ys, hs, cs = [], [], []
    for d in range(directions):
        reverse = direction == "reverse" or d == 1
        wb = b[d, :gates * hidden] if b is not None else 0
        rb = b[d, gates * hidden:] if b is not None else 0
        xw = jnp.matmul(x, w[d].T, precision="highest") + wb
        h = h0[d] if h0 is not None else jnp.zeros((batch, hidden), x.dtype)
        c = c0[d] if c0 is not None else jnp.zeros((batch, hidden), x.dtype)
        outs = [None] * steps
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h_new, c_new = cell(xw[t], h, c, r[d], rb, None if p is None else p[d], acts[d],
                                clip, hidden)
            if lens is not None:
                valid = t < lens[0]
                h_new = jnp.where(valid, h_new, h)
                c_new = jnp.where(valid, c_new, c)
                outs[t] = jnp.where(valid, h_new, jnp.zeros_like(h_new))
            else:
                outs[t] = h_new
            h, c = h_new, c_new
        ys.append(jnp.stack(outs) if steps else jnp.zeros((0, batch, hidden), x.dtype))
        hs.append(h)
        cs.append(c)
    y = jnp.stack(ys, 1)  # steps, directions, batch, hidden
    y_h, y_c = jnp.stack(hs), jnp.stack(cs)
    if layout:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), jnp.swapaxes(y_h, 0, 1), jnp.swapaxes(y_c, 0, 1)
    return y, y_h, y_c


def _clip(v, clip):
    return v if clip is None else jnp.clip(v, -clip, clip)


def _rnn_cell(xw, h, c, r, rb, p, acts, clip, hidden):
    return acts[0](_clip(xw + jnp.matmul(h, r.T, precision="highest") + rb, clip)), c


def _gru_cell_factory(linear_before_reset: bool):
    def cell(xw, h, c, r, rb, p, acts, clip, hidden):
        f, g = acts
        rz, rr, rh = jnp.split(r, 3)
        if not isinstance(rb, int):
            bz, br, bh = jnp.split(rb, 3)
        else:
            bz = br = bh = 0
        xz, xr, xh = jnp.split(xw, 3, axis=-1)
        z = f(_clip(xz + jnp.matmul(h, rz.T, precision="highest") + bz, clip))
        reset = f(_clip(xr + jnp.matmul(h, rr.T, precision="highest") + br, clip))
        if linear_before_reset:
            candidate = g(_clip(xh + reset * (jnp.matmul(h, rh.T, precision="highest") + bh), clip))
        else:
            candidate = g(_clip(xh + jnp.matmul(reset * h, rh.T, precision="highest") + bh, clip))
        return (1 - z) * candidate + z * h, c
    return cell


def _lstm_cell_factory(input_forget: bool):
    def cell(xw, h, c, r, rb, p, acts, clip, hidden):
        f, g, act_h = acts
        gates = xw + jnp.matmul(h, r.T, precision="highest") + rb
        gi, go, gf, gc = jnp.split(gates, 4, axis=-1)
        pi, po, pf = jnp.split(p, 3) if p is not None else (0, 0, 0)
        i = f(_clip(gi + pi * c, clip))
        forget = 1 - i if input_forget else f(_clip(gf + pf * c, clip))
        c_new = forget * c + i * g(_clip(gc, clip))
        o = f(_clip(go + po * c_new, clip))
        return o * act_h(c_new), c_new
    return cell


def _outputs(node, y, y_h, y_c=None):
    values = (y, y_h) if y_c is None else (y, y_h, y_c)
    return values[:len(node.outputs)] if len(node.outputs) > 1 else values[0]


@op
def RNN(node, x, w, r, b=None, lens=None, h0=None):
    y, y_h, _ = _recurrence(node, x, w, r, b, lens, h0, None, None, 1, ["Tanh"], _rnn_cell)
    return _outputs(node, y, y_h)


@op
def GRU(node, x, w, r, b=None, lens=None, h0=None):
    cell = _gru_cell_factory(bool(node.attr("linear_before_reset", 0)))
    y, y_h, _ = _recurrence(node, x, w, r, b, lens, h0, None, None, 3, ["Sigmoid", "Tanh"],
                            cell)
    return _outputs(node, y, y_h)


@op
def LSTM(node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    cell = _lstm_cell_factory(bool(node.attr("input_forget", 0)))
    y, y_h, y_c = _recurrence(node, x, w, r, b, lens, h0, c0, p, 4,
                              ["Sigmoid", "Tanh", "Tanh"], cell)
    return _outputs(node, y, y_h, y_c)
