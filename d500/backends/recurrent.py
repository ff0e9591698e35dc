"""RNN, GRU and LSTM written once over a framework's array primitives (its `Kit`): ONNX gate
orders, activations, directions, layouts and sequence lengths, unrolled step by step.

What a framework knows (its matmul's precision, how it makes zeros on its device) stays in its
own `rnn.py`, which builds a `Kit` and takes `table(kit)` as its op table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Kit:
    """The array primitives the recurrence uses, as one framework provides them."""

    matmul: Callable[[Any, Any], Any]
    where: Callable[[Any, Any, Any], Any]
    stack: Callable[[list, int], Any]
    zeros: Callable[[Any, tuple], Any]  # (like, shape): zeros in like's dtype and place
    permute: Callable[[Any, tuple], Any]
    split: Callable[[Any, int, int], list]  # (x, parts, axis): equal parts
    clip: Callable[[Any, float, float], Any]
    int64: Callable[[Any], Any]
    abs: Callable[[Any], Any]
    sigmoid: Callable[[Any], Any]
    tanh: Callable[[Any], Any]
    relu: Callable[[Any], Any]
    softplus: Callable[[Any], Any]
    leaky_relu: Callable[[Any, float], Any]
    elu: Callable[[Any, float], Any]


def _activation(kit: Kit, name: str, alpha: float | None, beta: float | None):
    """An ONNX RNN activation by name, with its alpha/beta."""
    name = name.lower()
    if name == "sigmoid":
        return kit.sigmoid
    if name == "tanh":
        return kit.tanh
    if name == "relu":
        return kit.relu
    if name == "affine":
        return lambda x: alpha * x + beta
    if name == "leakyrelu":
        return lambda x: kit.leaky_relu(x, alpha if alpha is not None else 0.01)
    if name == "thresholdedrelu":
        return lambda x: kit.where(x > (alpha if alpha is not None else 1.0), x, 0 * x)
    if name == "scaledtanh":
        return lambda x: alpha * kit.tanh(beta * x)
    if name == "hardsigmoid":
        a, b = alpha if alpha is not None else 0.2, beta if beta is not None else 0.5
        return lambda x: kit.clip(a * x + b, 0, 1)
    if name == "elu":
        return lambda x: kit.elu(x, alpha if alpha is not None else 1.0)
    if name == "softsign":
        return lambda x: x / (1 + kit.abs(x))
    if name == "softplus":
        return kit.softplus
    raise ValueError(f"unknown RNN activation {name}")


_NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}


def _activations(kit: Kit, node, defaults: list[str], directions: int) -> list[list]:
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
        fns.append(_activation(kit, name, a, b))
    n = len(defaults)
    return [fns[d * n:(d + 1) * n] for d in range(directions)]


def _recurrence(kit: Kit, node, x, w, r, b, lens, h0, c0, p, gates: int, defaults: list[str],
                cell):
    """Run every direction; return (Y, Y_h, Y_c) in the node's layout."""
    layout = node.attr("layout", 0)
    if layout:
        x = kit.permute(x, (1, 0, 2))
        h0 = None if h0 is None else kit.permute(h0, (1, 0, 2))
        c0 = None if c0 is None else kit.permute(c0, (1, 0, 2))
    steps, batch, _ = x.shape
    hidden = node.attr("hidden_size") or r.shape[-1]
    direction = node.attr("direction", "forward")
    directions = 2 if direction == "bidirectional" else 1
    acts = _activations(kit, node, defaults, directions)
    clip = node.attr("clip")
    if lens is not None:
        lens = kit.int64(lens).reshape(1, batch, 1)
    ys, hs, cs = [], [], []
    for d in range(directions):
        reverse = direction == "reverse" or d == 1
        wb = b[d, :gates * hidden] if b is not None else 0
        rb = b[d, gates * hidden:] if b is not None else 0
        xw = kit.matmul(x, w[d].T) + wb
        h = h0[d] if h0 is not None else kit.zeros(x, (batch, hidden))
        c = c0[d] if c0 is not None else kit.zeros(x, (batch, hidden))
        outs = [None] * steps
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h_new, c_new = cell(kit, xw[t], h, c, r[d], rb, None if p is None else p[d],
                                acts[d], clip)
            if lens is not None:
                valid = t < lens[0]
                h_new = kit.where(valid, h_new, h)
                c_new = kit.where(valid, c_new, c)
                outs[t] = kit.where(valid, h_new, kit.zeros(h_new, h_new.shape))
            else:
                outs[t] = h_new
            h, c = h_new, c_new
        ys.append(kit.stack(outs, 0) if steps else kit.zeros(x, (0, batch, hidden)))
        hs.append(h)
        cs.append(c)
    y = kit.stack(ys, 1)  # steps, directions, batch, hidden
    y_h, y_c = kit.stack(hs, 0), kit.stack(cs, 0)
    if layout:
        y = kit.permute(y, (2, 0, 1, 3))
        y_h, y_c = kit.permute(y_h, (1, 0, 2)), kit.permute(y_c, (1, 0, 2))
    return y, y_h, y_c


def _clip(kit: Kit, v, clip):
    return v if clip is None else kit.clip(v, -clip, clip)


def _rnn_cell(kit, xw, h, c, r, rb, p, acts, clip):
    return acts[0](_clip(kit, xw + kit.matmul(h, r.T) + rb, clip)), c


def _gru_cell_factory(linear_before_reset: bool):
    def cell(kit, xw, h, c, r, rb, p, acts, clip):
        f, g = acts
        rz, rr, rh = kit.split(r, 3, 0)
        bz, br, bh = (0, 0, 0) if isinstance(rb, int) else kit.split(rb, 3, 0)
        xz, xr, xh = kit.split(xw, 3, -1)
        z = f(_clip(kit, xz + kit.matmul(h, rz.T) + bz, clip))
        reset = f(_clip(kit, xr + kit.matmul(h, rr.T) + br, clip))
        if linear_before_reset:
            candidate = g(_clip(kit, xh + reset * (kit.matmul(h, rh.T) + bh), clip))
        else:
            candidate = g(_clip(kit, xh + kit.matmul(reset * h, rh.T) + bh, clip))
        return (1 - z) * candidate + z * h, c
    return cell


def _lstm_cell_factory(input_forget: bool):
    def cell(kit, xw, h, c, r, rb, p, acts, clip):
        f, g, act_h = acts
        gi, go, gf, gc = kit.split(xw + kit.matmul(h, r.T) + rb, 4, -1)
        pi, po, pf = kit.split(p, 3, 0) if p is not None else (0, 0, 0)
        i = f(_clip(kit, gi + pi * c, clip))
        forget = 1 - i if input_forget else f(_clip(kit, gf + pf * c, clip))
        c_new = forget * c + i * g(_clip(kit, gc, clip))
        o = f(_clip(kit, go + po * c_new, clip))
        return o * act_h(c_new), c_new
    return cell


def _outputs(node, y, y_h, y_c=None):
    values = (y, y_h) if y_c is None else (y, y_h, y_c)
    return values[:len(node.outputs)] if len(node.outputs) > 1 else values[0]


def RNN(kit: Kit, node, x, w, r, b=None, lens=None, h0=None):
    y, y_h, _ = _recurrence(kit, node, x, w, r, b, lens, h0, None, None, 1, ["Tanh"],
                            _rnn_cell)
    return _outputs(node, y, y_h)


def GRU(kit: Kit, node, x, w, r, b=None, lens=None, h0=None):
    cell = _gru_cell_factory(bool(node.attr("linear_before_reset", 0)))
    y, y_h, _ = _recurrence(kit, node, x, w, r, b, lens, h0, None, None, 3,
                            ["Sigmoid", "Tanh"], cell)
    return _outputs(node, y, y_h)


def LSTM(kit: Kit, node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    cell = _lstm_cell_factory(bool(node.attr("input_forget", 0)))
    y, y_h, y_c = _recurrence(kit, node, x, w, r, b, lens, h0, c0, p, 4,
                              ["Sigmoid", "Tanh", "Tanh"], cell)
    return _outputs(node, y, y_h, y_c)


def table(kit: Kit) -> dict[str, Any]:
    """The three operators bound to a framework's `kit`, keyed as an op table keys them."""
    return {fn.__name__: functools.partial(fn, kit) for fn in (RNN, GRU, LSTM)}
