"""Control flow, sequences and optionals in torch: If, Loop, Scan, Sequence*, Optional*.

Sequences are Python lists of tensors; an empty optional is None.
"""

from __future__ import annotations

import torch

from d500.backends.graph import registry
from d500.backends.torch.table import axis_of, device_of, ints

OPS, op = registry()


@op
def If(node, cond):
    branch = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    out = node.run_subgraph(branch)
    return tuple(out) if len(out) != 1 else out[0]


def _stack(values: list, device: torch.device):
    """Per-iteration scan outputs stacked along a new first axis (empty: a 0-length tensor)."""
    if values:
        return torch.stack(values) if isinstance(values[0], torch.Tensor) else values
    return torch.zeros((0,), device=device)


@op
def Loop(node, trip_count=None, cond=None, *carried):
    limit = None if trip_count is None else int(trip_count.reshape(-1)[0].item())
    keep_going = True if cond is None else bool(cond.reshape(-1)[0])
    n_carried = len(carried)
    state = list(carried)
    scans: list[list] = []
    i = 0
    device = device_of(node)
    while keep_going and (limit is None or i < limit):
        iteration = torch.tensor(i, dtype=torch.int64, device=device)
        cond_in = torch.tensor(keep_going, device=device)
        out = node.run_subgraph("body", iteration, cond_in, *state)
        keep_going = bool(out[0].reshape(-1)[0])
        state = list(out[1:1 + n_carried])
        if not scans:
            scans = [[] for _ in out[1 + n_carried:]]
        for acc, value in zip(scans, out[1 + n_carried:]):
            acc.append(value)
        i += 1
    n_scans = len(node.outputs) - n_carried
    if not scans:
        scans = [[] for _ in range(n_scans)]
    result = state + [_stack(acc, device) for acc in scans]
    return tuple(result) if len(result) != 1 else result[0]


@op
def Scan(node, *inputs):
    if node.opset < 9:
        return _scan_batched(node, *inputs)
    n_scan = node.attr("num_scan_inputs")
    n_state = len(inputs) - n_scan
    in_axes = node.attr("scan_input_axes") or [0] * n_scan
    xs = [x.movedim(axis_of(a, x.dim()), 0) for x, a in zip(inputs[n_state:], in_axes)]
    return _scan(node, list(inputs[:n_state]), xs, node.attr("scan_input_directions"),
                 xs[0].shape[0] if xs else 0)


def _scan_batched(node, lens, *inputs):
    """Scan-8: a batch axis first, scan axis 1, optional per-row sequence lengths."""
    n_state = len(inputs) - node.attr("num_scan_inputs")
    rows = []
    for b in range(inputs[0].shape[0]):
        steps = int(lens[b]) if lens is not None else inputs[n_state].shape[1]
        xs = [x[b, :steps] for x in inputs[n_state:]]
        out = _scan(node, [s[b] for s in inputs[:n_state]], xs, node.attr("directions"), steps)
        rows.append(out if isinstance(out, tuple) else (out,))
    result = tuple(torch.stack(values) for values in zip(*rows))
    return result if len(result) != 1 else result[0]


def _scan(node, state: list, xs: list, in_dirs, steps: int):
    """Run the body over axis 0 of every scan input; stack the scan outputs."""
    n_state = len(state)
    xs = [x.flip(0) if d else x for x, d in zip(xs, in_dirs or [0] * len(xs))]
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
        y = _stack(acc[::-1] if d else acc, device_of(node))
        results.append(y.movedim(0, axis_of(a, y.dim())))
    result = state + results
    return tuple(result) if len(result) != 1 else result[0]


# -- sequences ----------------------------------------------------------------------------------
@op
def SequenceConstruct(node, *xs):
    return list(xs)


@op
def SequenceEmpty(node):
    return []


@op
def SequenceLength(node, seq):
    return torch.tensor(len(seq), dtype=torch.int64, device=device_of(node))


def _position(pos, length: int, default: int) -> int:
    p = default if pos is None else int(pos.reshape(-1)[0].item())
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
    axis = axis_of(node.attr("axis", 0), x.dim())
    if split is None:
        parts = list(torch.split(x, 1, axis))
        return parts if node.attr("keepdims", 1) else [p.squeeze(axis) for p in parts]
    sizes = ints(split)
    if split.dim() == 0:
        return list(torch.split(x, sizes[0], axis))
    return list(torch.split(x, sizes, axis))


@op
def ConcatFromSequence(node, seq):
    axis = node.attr("axis")
    if node.attr("new_axis", 0):
        return torch.stack(seq, axis_of(axis, seq[0].dim() + 1))
    return torch.cat(seq, axis)


@op
def SequenceMap(node, seq, *extra):
    results: list[list] = [[] for _ in node.outputs]
    for i in range(len(seq)):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        for acc, value in zip(results, node.run_subgraph("body", *args)):
            acc.append(value)
    return tuple(results) if len(results) != 1 else results[0]


# -- optionals -----------------------------------------------------------------------------------
@op
def Optional(node, x=None):
    return x


@op
def OptionalHasElement(node, x=None):
    return torch.tensor(x is not None, device=device_of(node))


@op
def OptionalGetElement(node, x):
    return x

