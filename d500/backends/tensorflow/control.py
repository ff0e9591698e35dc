"""Control flow (If, Loop, Scan), sequences (Python lists) and optionals (None) in TensorFlow.

Subgraphs run through `node.run_subgraph`. When the condition or trip count is known while
tracing (a constant or a baked shape input), the control flow is unrolled in Python; otherwise
it becomes tf.cond / tf.while_loop.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ints, norm_axis, plain, static, tf_dtype

OPS, op = registry()


def _sub(node, attr, *values):
    """Run a subgraph; its outputs in ONNX's own layout."""
    return [plain(v) for v in node.run_subgraph(attr, *values)]


@op
def If(node, cond):
    value = static(cond)
    if value is not None:
        return tuple(_sub(node, "then_branch" if bool(np.asarray(value).reshape(-1)[0])
                                       else "else_branch"))
    c = tf.reshape(tf.cast(cond, tf.bool), [])
    return tuple(tf.cond(c, lambda: _sub(node, "then_branch"),
                         lambda: _sub(node, "else_branch")))


def _flag(x):
    v = static(x)
    return None if v is None else bool(np.asarray(v).reshape(-1)[0])


@op
def Loop(node, trip=None, cond=None, *state):
    body = node.attrs["body"]
    n_state = len(state)
    known = None if trip is None else static(trip)
    max_trip = None if known is None else int(np.asarray(known).reshape(-1)[0])
    flag = True if cond is None else _flag(cond)
    if flag is not None and max_trip is not None and max_trip <= 10000:
        return _unrolled(node, max_trip, cond, list(state), n_state)
    scan_names = body.output_names[1 + n_state:]
    dtypes = [tf_dtype(body.types[n].tensor_type.elem_type, node) for n in scan_names]
    tas = [tf.TensorArray(dt, size=0, dynamic_size=True, infer_shape=False) for dt in dtypes]
    if trip is None:
        limit = tf.constant(2 ** 62, tf.int64)
    else:
        limit = tf.cast(tf.reshape(trip, []), tf.int64)
    c0 = tf.constant(True) if cond is None else tf.reshape(tf.cast(cond, tf.bool), [])

    def keep_going(i, c, *rest):
        return tf.logical_and(c, i < limit)

    def step(i, c, *rest):
        values, arrays = list(rest[:n_state]), list(rest[n_state:])
        out = _sub(node, "body", i, c, *values)
        arrays = [ta.write(tf.cast(i, tf.int32), o) for ta, o in zip(arrays, out[1 + n_state:])]
        return (i + 1, tf.reshape(tf.cast(out[0], tf.bool), []), *out[1:1 + n_state], *arrays)

    loop_vars = (tf.constant(0, tf.int64), c0, *state, *tas)
    invariants = (tf.TensorShape([]), tf.TensorShape([]), *[
        tf.TensorShape(None) for _ in state], *[tf.TensorShape(None) for _ in tas])
    result = tf.while_loop(keep_going, step, loop_vars, shape_invariants=invariants)
    finals = list(result[2:2 + n_state])
    scans = [ta.stack() for ta in result[2 + n_state:]]
    return tuple(finals + scans)


def _unrolled(node, max_trip, cond, state, n_state):
    scans: list[list] = []
    c = tf.constant(True) if cond is None else cond
    for i in range(max_trip):
        flag = _flag(c)
        if flag is False:
            break
        if flag is None:
            raise node.unsupported("a loop condition computed at run time with a trip count")
        out = _sub(node, "body", tf.constant(i, tf.int64), c, *state)
        c, state = out[0], list(out[1:1 + n_state])
        for k, v in enumerate(out[1 + n_state:]):
            if len(scans) <= k:
                scans.append([])
            scans[k].append(v)
    body = node.attrs["body"]
    n_scan = len(body.output_names) - 1 - n_state
    stacked = []
    for k in range(n_scan):
        if k < len(scans) and scans[k]:
            stacked.append(tf.stack(scans[k]))
        else:
            t = body.types[body.output_names[1 + n_state + k]].tensor_type
            stacked.append(tf.zeros([0], tf_dtype(t.elem_type, node)))
    return tuple(state + stacked)


def _scan8(node, lens, *inputs):
    """Scan-8: a batch axis first, every batch row scanned on its own (full lengths only)."""
    m = node.attr("num_scan_inputs")
    state, xs = list(inputs[:len(inputs) - m]), list(inputs[len(inputs) - m:])
    if lens is not None and static(lens) is not None and np.any(
            np.asarray(static(lens)) != xs[0].shape[1]):
        raise node.unsupported("Scan-8 with sequence lengths shorter than the input")
    dirs = node.attr("directions") or [0] * m
    rows = []
    for b in range(xs[0].shape[0]):
        st = [s[b] for s in state]
        outs: list[list] = []
        steps = range(xs[0].shape[1])
        for t in steps:
            res = _sub(node, "body", *st, *[x[b, steps[-1 - t] if d else t]
                                            for x, d in zip(xs, dirs)])
            st = list(res[:len(st)])
            for k, v in enumerate(res[len(st):]):
                if len(outs) <= k:
                    outs.append([])
                outs[k].append(v)
        rows.append(st + [tf.stack(o) for o in outs])
    return tuple(tf.stack([r[k] for r in rows]) for k in range(len(rows[0])))


@op
def Scan(node, *inputs):
    if node.opset < 9:
        return _scan8(node, *inputs)
    m = node.attr("num_scan_inputs")
    state, xs = list(inputs[:len(inputs) - m]), list(inputs[len(inputs) - m:])
    in_axes = node.attr("scan_input_axes") or [0] * m
    in_dirs = node.attr("scan_input_directions") or [0] * m
    xs = [tf.unstack(x, axis=norm_axis(a, x.shape.rank)) for x, a in zip(xs, in_axes)]
    xs = [x[::-1] if d else x for x, d in zip(xs, in_dirs)]
    steps = len(xs[0])
    outs: list[list] = []
    for t in range(steps):
        res = _sub(node, "body", *state, *[x[t] for x in xs])
        state = list(res[:len(state)])
        for k, v in enumerate(res[len(state):]):
            if len(outs) <= k:
                outs.append([])
            outs[k].append(v)
    n_out = len(outs)
    out_axes = node.attr("scan_output_axes") or [0] * n_out
    out_dirs = node.attr("scan_output_directions") or [0] * n_out
    stacked = []
    for seq, a, d in zip(outs, out_axes, out_dirs):
        seq = seq[::-1] if d else seq
        stacked.append(tf.stack(seq, axis=norm_axis(a, seq[0].shape.rank + 1)))
    return tuple(state + stacked)


# -- sequences -------------------------------------------------------------------
@op
def SequenceEmpty(node):
    return []


@op
def SequenceConstruct(node, *xs):
    return list(xs)


def _pos(node, pos, n, default):
    if pos is None:
        return default
    p = ints(pos, node, "position")[0]
    return p + n if p < 0 else p


@op
def SequenceAt(node, seq, pos):
    return seq[_pos(node, pos, len(seq), 0)]


@op
def SequenceInsert(node, seq, x, pos=None):
    out = list(seq)
    out.insert(_pos(node, pos, len(seq), len(seq)), x)
    return out


@op
def SequenceErase(node, seq, pos=None):
    out = list(seq)
    del out[_pos(node, pos, len(seq), len(seq) - 1)]
    return out


@op
def SequenceLength(node, seq):
    return tf.constant(len(seq), tf.int64)


@op
def ConcatFromSequence(node, seq):
    axis = node.attr("axis")
    if node.attr("new_axis", 0):
        return tf.stack(seq, axis=norm_axis(axis, seq[0].shape.rank + 1))
    return tf.concat(seq, axis=norm_axis(axis, seq[0].shape.rank))


@op
def SplitToSequence(node, x, split=None):
    axis = norm_axis(node.attr("axis", 0), x.shape.rank)
    if split is None:
        parts = tf.unstack(x, axis=axis)
        return parts if not node.attr("keepdims", 1) else [tf.expand_dims(p, axis)
                                                          for p in parts]
    sizes = ints(split, node, "split")
    if np.ndim(static(split)) == 0:
        n = x.shape[axis]
        sizes = [sizes[0]] * (n // sizes[0]) + ([n % sizes[0]] if n % sizes[0] else [])
    return list(tf.split(x, sizes, axis=axis))


@op
def SequenceMap(node, seq, *extra):
    n = len(seq)
    results: list[list] = []
    for i in range(n):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        out = _sub(node, "body", *args)
        for k, v in enumerate(out):
            if len(results) <= k:
                results.append([])
            results[k].append(v)
    return tuple(results) if results else tuple([] for _ in node.outputs)


# -- optionals ---------------------------------------------------------------------
@op
def Optional(node, x=None):
    return x


@op
def OptionalHasElement(node, x=None):
    return tf.constant(x is not None)


@op
def OptionalGetElement(node, x):
    return x

