"""What the torch op modules share: small helpers for op functions (the registering decorator is
d500.backends.graph.registry, as in every backend)."""

from __future__ import annotations

from typing import Any

import torch
from onnx import TensorProto as T

from d500.backends.graph import Node, out_type

UNSIGNED_BITS = {T.UINT16: 16, T.UINT32: 32}


def wrap(node: Node, y: torch.Tensor, i: int = 0) -> torch.Tensor:
    """Wrap an integer result into the range of the node's uint16/uint32 output, if it has one."""
    if y.dtype in (torch.int32, torch.int64):
        bits = UNSIGNED_BITS.get(out_type(node, i))
        if bits is not None:
            return y & ((1 << bits) - 1)
    return y


def ints(x: Any) -> list[int] | None:
    """A 1-D integer tensor (or None, or a list) as a list of Python ints."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.reshape(-1).tolist()]
    return [int(v) for v in x]


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def device_of(node: Node) -> torch.device:
    """The device the prepared model runs on (set on every node at prepare time)."""
    return getattr(node, "device", None) or torch.device("cpu")


def constant(node: Node, array: Any) -> Any:
    """A NumPy attribute value as a stored tensor on the model's device."""
    from d500.backends.torch.dtypes import from_numpy
    return from_numpy(array, device_of(node))
