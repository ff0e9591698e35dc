"""Loop, Scan, sequences and optionals written once over a framework's primitives (its `Kit`):
the iteration bookkeeping of a body subgraph, scan axes and directions, sequence positions.

Sequences are Python lists of arrays; an empty optional is None. A framework keeps what only it
knows in its own `control.py` (If, SplitToSequence, how it reads a condition) and takes
`table(kit)` into its op table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Kit:
    """The primitives the control-flow ops use, as one framework provides them."""

    flag: Callable[[Any, str], bool]  # (condition, what it is): its first element as a bool
    count: Callable[[Any, str], int]  # (integer input, what it is): its first element
    scalar: Callable[[Any, Any], Any]  # (node, NumPy scalar): a 0-d array where the model runs
    is_array: Callable[[Any], bool]  # a per-iteration value to stack (not a sequence)
    empty: Callable[[Any], Any]  # (node): the 0-length float32 array of a scan with no steps
    stack: Callable[[list, int], Any]
    concat: Callable[[list, int], Any]
    moveaxis: Callable[[Any, int, int], Any]
    flip: Callable[[Any], Any]  # reversed along axis 0
    axis: Callable[[int, int], int]  # (axis, rank): the axis counted from the front


def one(out: list):
    """A node's outputs as an op returns them: the value alone when there is one."""
    return tuple(out) if len(out) != 1 else out[0]


def _stack(kit: Kit, node, values: list):
    """Per-iteration scan outputs stacked along a new first axis (empty: a 0-length array)."""
    if values:
        return kit.stack(values, 0) if kit.is_array(values[0]) else values
    return kit.empty(node)


def Loop(kit: Kit, node, trip_count=None, cond=None, *carried):
    limit = None if trip_count is None else kit.count(trip_count, "trip count")
    keep_going = True if cond is None else kit.flag(cond, "loop condition")
    n_carried = len(carried)
    state = list(carried)
    scans: list[list] = []
    i = 0
    while keep_going and (limit is None or i < limit):
        out = node.run_subgraph("body", kit.scalar(node, np.int64(i)),
                                kit.scalar(node, np.bool_(keep_going)), *state)
        keep_going = kit.flag(out[0], "loop condition")
        state = list(out[1:1 + n_carried])
        if not scans:
            scans = [[] for _ in out[1 + n_carried:]]
        for acc, value in zip(scans, out[1 + n_carried:]):
            acc.append(value)
        i += 1
    n_scans = len(node.outputs) - n_carried
    if not scans:
        scans = [[] for _ in range(n_scans)]
    return one(state + [_stack(kit, node, acc) for acc in scans])


def Scan(kit: Kit, node, *inputs):
    if node.opset < 9:
        return _scan_batched(kit, node, *inputs)
    n_scan = node.attr("num_scan_inputs")
    n_state = len(inputs) - n_scan
    in_axes = node.attr("scan_input_axes") or [0] * n_scan
    xs = [kit.moveaxis(x, kit.axis(a, x.ndim), 0) for x, a in zip(inputs[n_state:], in_axes)]
    return _scan(kit, node, list(inputs[:n_state]), xs, node.attr("scan_input_directions"),
                 xs[0].shape[0] if xs else 0)


def _scan_batched(kit: Kit, node, lens, *inputs):
    """Scan-8: a batch axis first, scan axis 1, optional per-row sequence lengths."""
    n_state = len(inputs) - node.attr("num_scan_inputs")
    rows = []
    for b in range(inputs[0].shape[0]):
        steps = (kit.count(lens[b], "sequence lengths") if lens is not None
                 else inputs[n_state].shape[1])
        xs = [x[b, :steps] for x in inputs[n_state:]]
        out = _scan(kit, node, [s[b] for s in inputs[:n_state]], xs, node.attr("directions"),
                    steps)
        rows.append(out if isinstance(out, tuple) else (out,))
    return one([kit.stack(values, 0) for values in zip(*rows)])


def _scan(kit: Kit, node, state: list, xs: list, in_dirs, steps: int):
    """Run the body over axis 0 of every scan input; stack the scan outputs."""
    n_state = len(state)
    xs = [kit.flip(x) if d else x for x, d in zip(xs, in_dirs or [0] * len(xs))]
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
        y = _stack(kit, node, acc[::-1] if d else acc)
        results.append(kit.moveaxis(y, 0, kit.axis(a, y.ndim)))
    return one(state + results)


# -- sequences ----------------------------------------------------------------------------------
def SequenceConstruct(kit: Kit, node, *xs):
    return list(xs)


def SequenceEmpty(kit: Kit, node):
    return []


def SequenceLength(kit: Kit, node, seq):
    return kit.scalar(node, np.int64(len(seq)))


def _position(kit: Kit, pos, length: int, default: int) -> int:
    p = default if pos is None else kit.count(pos, "position")
    return p + length if p < 0 else p


def SequenceAt(kit: Kit, node, seq, pos):
    return seq[_position(kit, pos, len(seq), 0)]


def SequenceInsert(kit: Kit, node, seq, x, pos=None):
    out = list(seq)
    out.insert(_position(kit, pos, len(seq), len(seq)), x)
    return out


def SequenceErase(kit: Kit, node, seq, pos=None):
    out = list(seq)
    del out[_position(kit, pos, len(seq), -1)]
    return out


def ConcatFromSequence(kit: Kit, node, seq):
    axis = node.attr("axis")
    if node.attr("new_axis", 0):
        return kit.stack(seq, kit.axis(axis, seq[0].ndim + 1))
    return kit.concat(seq, axis)


def SequenceMap(kit: Kit, node, seq, *extra):
    results: list[list] = [[] for _ in node.outputs]
    for i in range(len(seq)):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        for acc, value in zip(results, node.run_subgraph("body", *args)):
            acc.append(value)
    return one(results)


# -- optionals -----------------------------------------------------------------------------------
def Optional(kit: Kit, node, x=None):
    return x


def OptionalHasElement(kit: Kit, node, x=None):
    return kit.scalar(node, np.bool_(x is not None))


def OptionalGetElement(kit: Kit, node, x):
    return x


def table(kit: Kit) -> dict[str, Any]:
    """These ops bound to a framework's `kit`, keyed as an op table keys them."""
    fns = (Loop, Scan, SequenceConstruct, SequenceEmpty, SequenceLength, SequenceAt,
           SequenceInsert, SequenceErase, ConcatFromSequence, SequenceMap, Optional,
           OptionalHasElement, OptionalGetElement)
    return {fn.__name__: functools.partial(fn, kit) for fn in fns}
