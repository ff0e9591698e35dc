"""Channels-last values, shared by the backends that run convolutions in N...C (TensorFlow, JAX):
the value type, `plain` (a value back in ONNX's NC... layout) and the elementwise operators that
run on channels-last data as they are."""

from __future__ import annotations

from typing import Any

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Relu",
               "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "Celu",
               "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Exp", "Log", "Sqrt", "Neg",
               "Abs", "Erf", "Identity", "Gelu", "Mish", "Swish", "ThresholdedRelu", "Where",
               "Reciprocal"}


class ChannelsLast:
    """A channels-first (NC...) ONNX value held channels-last (N...C) in `t`; a framework's
    subclass says how to transpose it back (`nchw`)."""

    __slots__ = ("t",)

    def __init__(self, t: Any):
        self.t = t

    def nchw(self) -> Any:
        raise NotImplementedError


def plain(x: Any) -> Any:
    """x in ONNX's own layout (lists and tuples converted element by element)."""
    if isinstance(x, ChannelsLast):
        return x.nchw()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    return x
