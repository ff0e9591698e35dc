"""Data flow in an ONNX graph: the nodes an output depends on, and the names a node's subgraphs
read from the scope around it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx


def needed_nodes(nodes: Sequence[tuple[Sequence[str], Sequence[str], Any]],
                 outputs: Sequence[str]) -> tuple[list[int], set[str]]:
    """The indices of the nodes, given as (inputs, outputs, NodeProto) in execution order, that
    `outputs` depend on, and every name those nodes read (subgraphs' outer names included)."""
    need, keep = set(outputs), []
    for i in range(len(nodes) - 1, -1, -1):
        ins, outs, proto = nodes[i]
        if any(o in need for o in outs if o):
            keep.append(i)
            need.update(n for n in ins if n)
            need.update(outer_reads(proto))
    return keep[::-1], need


def outer_reads(proto: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of a node read from the scope around it."""
    names: set[str] = set()
    for a in proto.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for inner in g.node:
                names.update(n for n in [*inner.input, *outer_reads(inner)]
                             if n and n not in defined)
                defined.update(inner.output)
            names.update(o.name for o in g.output if o.name not in defined)
    return names
