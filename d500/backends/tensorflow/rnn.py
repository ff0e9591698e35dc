"""Recurrent operators in TensorFlow: RNN, GRU, LSTM, unrolled over the (static) sequence length."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry

OPS, op = registry()


def _activation(name, alpha, beta):
    name = name.lower()
    table = {
        "relu": tf.nn.relu, "tanh": tf.tanh, "sigmoid": tf.sigmoid,
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: tf.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: tf.where(x > alpha, x, tf.zeros_like(x)),
        "scaledtanh": lambda x: alpha * tf.tanh(beta * x),
        "hardsigmoid": lambda x: tf.clip_by_value(alpha * x + beta, 0, 1),
        "elu": lambda x: tf.where(x > 0, x, alpha * (tf.exp(x) - 1)),
        "softsign": lambda x: x / (1 + tf.abs(x)), "softplus": tf.nn.softplus,
    }
    return table[name]


_DEFAULT_ALPHA = {"affine": 1.0, "leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0,
                  "hardsigmoid": 0.2, "elu": 1.0}
_DEFAULT_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}


def _activations(node, defaults, directions):
    names = node.attr("activations") or defaults * directions
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    out = []
    for name in names:
        key = name.lower()
        a = alphas.pop(0) if alphas and key in _DEFAULT_ALPHA else _DEFAULT_ALPHA.get(key, 0.0)
        b = betas.pop(0) if betas and key in _DEFAULT_BETA else _DEFAULT_BETA.get(key, 0.0)
        out.append(_activation(name, a, b))
    per = len(defaults)
    return [out[d * per:(d + 1) * per] for d in range(directions)]


def _recurrent(node, gates, step, x, w, r, b, lens, states):
    """Shared driver: directions, layout, sequence lengths; `step` maps (x_t, states) -> states."""
    layout = node.attr("layout", 0)
    if layout:
        x = tf.transpose(x, [1, 0, 2])
        states = [None if s is None else tf.transpose(s, [1, 0, 2]) for s in states]
    seq, batch = x.shape[0], x.shape[1]
    hidden = node.attr("hidden_size") or r.shape[-1]
    direction = node.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    if b is None:
        b = tf.zeros([dirs, 2 * gates * hidden], x.dtype)
    clip = node.attr("clip")
    ys, finals = [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        xd = x
        if reverse:
            xd = tf.reverse(x, [0]) if lens is None else tf.reverse_sequence(
                x, lens, seq_axis=0, batch_axis=1)
        st = [tf.zeros([batch, hidden], x.dtype) if s is None else s[d] for s in states]
        wd, rd, bd = w[d], r[d], b[d]
        xw = tf.einsum("tbi,gi->tbg", xd, wd) + bd[:gates * hidden]
        outs = []
        for t in range(seq):
            new = step(node, d, xw[t], st, rd, bd[gates * hidden:], clip)
            if lens is not None:
                alive = (t < tf.cast(lens, tf.int32))[:, tf.newaxis]
                new = [tf.where(alive, n, s) for n, s in zip(new, st)]
                outs.append(tf.where(alive, new[0], tf.zeros_like(new[0])))
            else:
                outs.append(new[0])
            st = new
        y = tf.stack(outs) if outs else tf.zeros([0, batch, hidden], x.dtype)
        if reverse:
            y = tf.reverse(y, [0]) if lens is None else tf.reverse_sequence(
                y, lens, seq_axis=0, batch_axis=1)
        ys.append(y)
        finals.append(st)
    y = tf.stack(ys, 1)  # [seq, dirs, batch, hidden]
    final = [tf.stack([f[k] for f in finals]) for k in range(len(states))]
    if layout:
        y = tf.transpose(y, [2, 0, 1, 3])
        final = [tf.transpose(f, [1, 0, 2]) for f in final]
    return (y, *final)


def _clip(v, clip):
    return v if clip is None else tf.clip_by_value(v, -clip, clip)


@op
def RNN(node, x, w, r, b=None, lens=None, h0=None):
    acts = _activations(node, ["Tanh"], 2 if node.attr("direction") == "bidirectional" else 1)

    def step(node, d, xw, st, rd, rb, clip):
        (h,) = st
        return [acts[d][0](_clip(xw + tf.matmul(h, rd, transpose_b=True) + rb, clip))]
    return _recurrent(node, 1, step, x, w, r, b, lens, [h0])


@op
def GRU(node, x, w, r, b=None, lens=None, h0=None):
    acts = _activations(node, ["Sigmoid", "Tanh"],
                        2 if node.attr("direction") == "bidirectional" else 1)
    before_reset = node.attr("linear_before_reset", 0)

    def step(node, d, xw, st, rd, rb, clip):
        (h,) = st
        f, g = acts[d]
        xz, xr, xh = tf.split(xw, 3, -1)
        rz, rr, rh = tf.split(rd, 3, 0)
        bz, br, bh = tf.split(rb, 3, 0)
        z = f(_clip(xz + tf.matmul(h, rz, transpose_b=True) + bz, clip))
        rg = f(_clip(xr + tf.matmul(h, rr, transpose_b=True) + br, clip))
        if before_reset:
            hh = g(_clip(xh + rg * (tf.matmul(h, rh, transpose_b=True) + bh), clip))
        else:
            hh = g(_clip(xh + tf.matmul(rg * h, rh, transpose_b=True) + bh, clip))
        return [(1 - z) * hh + z * h]
    return _recurrent(node, 3, step, x, w, r, b, lens, [h0])


@op
def LSTM(node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    dirs = 2 if node.attr("direction") == "bidirectional" else 1
    acts = _activations(node, ["Sigmoid", "Tanh", "Tanh"], dirs)
    couple = node.attr("input_forget", 0)

    def step(node, d, xw, st, rd, rb, clip):
        h, c = st
        f, g, hfn = acts[d]
        gates = xw + tf.matmul(h, rd, transpose_b=True) + rb
        gi, go, gf, gc = tf.split(gates, 4, -1)
        if p is not None:
            pi, po, pf = tf.split(p[d], 3, 0)
            gi, gf = gi + pi * c, gf + pf * c
        i = f(_clip(gi, clip))
        fg = 1 - i if couple else f(_clip(gf, clip))
        c_new = fg * c + i * g(_clip(gc, clip))
        if p is not None:
            go = go + po * c_new
        o = f(_clip(go, clip))
        return [o * hfn(c_new), c_new]
    y, h_n, c_n = _recurrent(node, 4, step, x, w, r, b, lens, [h0, c0])
    return y, h_n, c_n
