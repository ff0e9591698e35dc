"""Control flow, sequences and optionals in JAX: If, Loop, Scan, Sequence*, Optional*.

Sequences are Python lists of arrays; an empty optional is None. Loops and scans unroll while
tracing, so their trip counts (and a Loop's condition) must be known then; an If on a traced
condition computes both branches and selects, when their outputs agree in shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, ints, norm_axis, static

OPS, op = registry()


def _flag(x, what: str) -> bool:
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return bool(value.reshape(-1)[0])


def _one(out: list):
    return tuple(out) if len(out) != 1 else out[0]


@op
def If(node, cond):
    value = static(cond)
    if value is not None:
        branch = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
        return _one(node.run_subgraph(branch))
    then, other = node.run_subgraph("then_branch"), node.run_subgraph("else_branch")
    flat_then, tree = jax.tree_util.tree_flatten(then)
    flat_other, tree_other = jax.tree_util.tree_flatten(other)
    if tree != tree_other or any(
            getattr(a, "shape", None) != getattr(b, "shape", None) for a, b in zip(
                flat_then, flat_other)):
        raise NotStatic("condition (its branches' outputs differ in shape)")
    c = jnp.asarray(cond).reshape(-1)[0]
    picked = [jnp.where(c, a, b) for a, b in zip(flat_then, flat_other)]
    return _one(jax.tree_util.tree_unflatten(tree, picked))


def _stack(values: list):
    """Per-iteration scan outputs stacked along a new first axis (empty: a 0-length array)."""
    if values:
        return jnp.stack(values) if not isinstance(values[0], list) else values
    return jnp.zeros((0,), jnp.float32)


@op
def Loop(node, trip_count=None, cond=None, *carried):
    limit = None if trip_count is None else ints(trip_count, "trip count")[0]
    keep_going = True if cond is None else _flag(cond, "loop condition")
    n_carried = len(carried)
    state = list(carried)
    scans: list[list] = []
    i = 0
    while keep_going and (limit is None or i < limit):
        out = node.run_subgraph("body", jnp.asarray(np.int64(i)), jnp.asarray(keep_going),
                                *state)
        keep_going = _flag(out[0], "loop condition")
        state = list(out[1:1 + n_carried])
        if not scans:
            scans = [[] for _ in out[1 + n_carried:]]
        for acc, value in zip(scans, out[1 + n_carried:]):
            acc.append(value)
        i += 1
    n_scans = len(node.outputs) - n_carried
    if not scans:
        scans = [[] for _ in range(n_scans)]
    return _one(state + [_stack(acc) for acc in scans])


@op
def Scan(node, *inputs):
    if node.opset < 9:
        return _scan_batched(node, *inputs)
    n_scan = node.attr("num_scan_inputs")
    n_state = len(inputs) - n_scan
    in_axes = node.attr("scan_input_axes") or [0] * n_scan
    xs = [jnp.moveaxis(x, norm_axis(a, x.ndim), 0) for x, a in zip(inputs[n_state:], in_axes)]
    return _scan(node, list(inputs[:n_state]), xs, node.attr("scan_input_directions"),
                 xs[0].shape[0] if xs else 0)


def _scan_batched(node, lens, *inputs):
    """Scan-8: a batch axis first, scan axis 1, optional per-row sequence lengths."""
    n_state = len(inputs) - node.attr("num_scan_inputs")
    rows = []
    lengths = None if lens is None else ints(lens, "sequence lengths")
    for b in range(inputs[0].shape[0]):
        steps = lengths[b] if lengths is not None else inputs[n_state].shape[1]
        xs = [x[b, :steps] for x in inputs[n_state:]]
        out = _scan(node, [s[b] for s in inputs[:n_state]], xs, node.attr("directions"), steps)
        rows.append(out if isinstance(out, tuple) else (out,))
    return _one([jnp.stack(values) for values in zip(*rows)])


def _scan(node, state: list, xs: list, in_dirs, steps: int):
    """Run the body over axis 0 of every scan input; stack the scan outputs."""
    n_state = len(state)
    xs = [jnp.flip(x, 0) if d else x for x, d in zip(xs, in_dirs or [0] * len(xs))]
    scans: list[list] = []
    for t in range(steps):
        out = node.run_subgraph("body", *state, *[x[t] for x in xs])
        state = list(out[:n_state])
        if not scans:
            scans = [[] for _ in out[n_state:]]
        for acc, value in zip(scans, out[n_state:]):
            acc.append(value)
    n_out = len(node.outputs) - n_state
    out_axes = node.attr("scan_output_axes") or [0] * n_out
    out_dirs = node.attr("scan_output_directions") or [0] * n_out
    results = []
    for acc, a, d in zip(scans or [[]] * n_out, out_axes, out_dirs):
        y = _stack(acc[::-1] if d else acc)
        results.append(jnp.moveaxis(y, 0, norm_axis(a, y.ndim)))
    return _one(state + results)


# -- sequences ----------------------------------------------------------------------------------
@op
def SequenceConstruct(node, *xs):
    return list(xs)


@op
def SequenceEmpty(node):
    return []


@op
def SequenceLength(node, seq):
    return jnp.asarray(np.int64(len(seq)))


def _position(pos, length: int, default: int) -> int:
    p = default if pos is None else ints(pos, "position")[0]
    return p + length if p < 0 else p


@op
def SequenceAt(node, seq, pos):
    return seq[_position(pos, len(seq), 0)]


@op
def SequenceInsert(node, seq, x, pos=None):
    out = list(seq)
    out.insert(_position(pos, len(seq), len(seq)), x)
    return out


@op
def SequenceErase(node, seq, pos=None):
    out = list(seq)
    del out[_position(pos, len(seq), -1)]
    return out


@op
def SplitToSequence(node, x, split=None):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    if split is None:
        parts = jnp.split(x, x.shape[axis], axis)
        return list(parts) if node.attr("keepdims", 1) else [p.squeeze(axis) for p in parts]
    sizes = ints(split, "split")
    if split.ndim == 0:
        sizes = [sizes[0]] * (x.shape[axis] // sizes[0]) + (
            [x.shape[axis] % sizes[0]] if x.shape[axis] % sizes[0] else [])
    return list(jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis))


@op
def ConcatFromSequence(node, seq):
    axis = node.attr("axis")
    if node.attr("new_axis", 0):
        return jnp.stack(seq, norm_axis(axis, seq[0].ndim + 1))
    return jnp.concatenate(seq, axis)


@op
def SequenceMap(node, seq, *extra):
    results: list[list] = [[] for _ in node.outputs]
    for i in range(len(seq)):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        for acc, value in zip(results, node.run_subgraph("body", *args)):
            acc.append(value)
    return _one(results)


# -- optionals -----------------------------------------------------------------------------------
@op
def Optional(node, x=None):
    return x


@op
def OptionalHasElement(node, x=None):
    return jnp.asarray(x is not None)


@op
def OptionalGetElement(node, x):
    return x
