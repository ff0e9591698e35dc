"""What the reference backend's NumPy VJP modules share: Step (one executed node) and helpers.

A VJP function gets a `Step` (the node's attributes, opset, forward inputs `x` and outputs `y`)
and the gradients of the node's outputs `g` (None where an output received none), and returns
the gradients of its inputs (None for inputs that are not differentiable, e.g. shapes, indices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

Grad = np.ndarray | None


@dataclass
class Step:
    """One executed node as its VJP sees it."""

    node: onnx.NodeProto
    opset: int
    x: list[Any]  # forward inputs (None for a missing optional input)
    y: list[Any]  # forward outputs
    attrs: dict[str, Any]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `g` over the axes NumPy broadcasting added or stretched to reach it from `shape`."""
    g = np.asarray(g)
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g.reshape(shape)


def like(g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`g` in the dtype of `x`."""
    return np.asarray(g, dtype=x.dtype)
