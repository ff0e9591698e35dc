"""Analytic FLOP counts of one operator call (for GFLOP/s): one function per ONNX operator.

Counts are the useful work of the operator's definition: a multiply-add is 2 FLOPs, padding and
redundant work are not counted, a pooling window costs one operation per element it covers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Shapes = Sequence[Sequence[int]]


def Conv(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    x, w, y = ins[0], ins[1], outs[0]
    group = int(attrs.get("group", 1))
    per_output = 2 * (x[1] // group) * math.prod(w[2:])
    bias = math.prod(y) if len(ins) > 2 else 0
    return float(math.prod(y) * per_output + bias)


def Gemm(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    a, y = ins[0], outs[0]
    k = a[0] if attrs.get("transA", 0) else a[1]
    bias = math.prod(y) if len(ins) > 2 else 0
    return float(2 * math.prod(y) * k + bias)


def MatMul(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    return float(2 * math.prod(outs[0]) * ins[0][-1])


def MaxPool(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    return float(math.prod(outs[0]) * math.prod(attrs.get("kernel_shape", [1])))


AveragePool = MaxPool
LpPool = MaxPool


def GlobalAveragePool(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    return float(math.prod(ins[0]))


GlobalMaxPool = GlobalAveragePool


def BatchNormalization(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    """(x - mean) / sqrt(var + eps) * scale + bias: 4 per element."""
    return float(4 * math.prod(ins[0]))


def LayerNormalization(attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float:
    """mean (1), variance (3), normalise (2), scale and bias (2): 8 per element."""
    return float(8 * math.prod(ins[0]))


InstanceNormalization = LayerNormalization
GroupNormalization = LayerNormalization

FORMULAS: dict[str, Callable[[Mapping[str, Any], Shapes, Shapes], float]] = {
    name: fn for name, fn in globals().items() if name[:1].isupper() and callable(fn)
    and name not in ("Callable", "Mapping", "Sequence", "Any", "Shapes")}


def count(op_type: str, attrs: Mapping[str, Any], ins: Shapes, outs: Shapes) -> float | None:
    """FLOPs of one call, or None for an operator without a formula."""
    fn = FORMULAS.get(op_type)
    return None if fn is None else fn(attrs, ins, outs)
