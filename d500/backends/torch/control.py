"""Control flow, sequences and optionals in torch: If and SplitToSequence here, Loop, Scan,
Sequence* and Optional* from the shared `control_flow` module over torch's primitives.

Sequences are Python lists of tensors; an empty optional is None.
"""

from __future__ import annotations

import torch

from d500.backends import control_flow
from d500.backends.control_flow import one
from d500.backends.graph import registry
from d500.backends.torch.table import axis_of, device_of, ints

OPS, op = registry()
KIT = control_flow.Kit(
    flag=lambda x, what: bool(x.reshape(-1)[0]),
    count=lambda x, what: int(x.reshape(-1)[0].item()),
    scalar=lambda node, value: torch.tensor(value, device=device_of(node)),
    is_array=lambda x: isinstance(x, torch.Tensor),
    empty=lambda node: torch.zeros((0,), device=device_of(node)),
    stack=torch.stack, concat=torch.cat, moveaxis=torch.movedim, flip=lambda x: x.flip(0),
    axis=axis_of)
OPS.update(control_flow.table(KIT))


@op
def If(node, cond):
    branch = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return one(node.run_subgraph(branch))


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
