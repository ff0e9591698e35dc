"""Deliberately broken variants of the numpy im2col Conv submission (they must be flagged)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from d500.operators.base import load_class

ROOT = Path(__file__).resolve().parents[3]
Im2colConv = load_class(ROOT / "submissions/numpy-im2col-conv/conv.py", "Im2colConv").cls


class WrongGradientConv(Im2colConv):
    """dX wrong (scaled by 1.5) in every 32nd element: about 3% of them."""

    def backward(self, grad_outputs, inputs, outputs):
        dx, *rest = super().backward(grad_outputs, inputs, outputs)
        flat = dx.reshape(-1).copy()
        flat[::32] *= 1.5
        return (flat.reshape(dx.shape), *rest)


class OneWrongWeightGradientConv(Im2colConv):
    """dW wrong in exactly one element (index 0, 1, 2, 1) by 1%."""

    def backward(self, grad_outputs, inputs, outputs):
        dx, dw, *rest = super().backward(grad_outputs, inputs, outputs)
        dw = dw.copy()
        dw[0, 1, 2, 1] *= 1.01
        return (dx, dw, *rest)


class WrongPaddingConv(Im2colConv):
    """Pads by repeating the border (np.pad mode 'edge') instead of with zeros."""

    def _pad(self, x, pads):
        return np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), mode="edge")


class SwappedPaddingConv(Im2colConv):
    """Swaps begin and end pads (only visible with asymmetric pads)."""

    def __init__(self, **attrs):
        super().__init__(**attrs)
        self.pads = self.pads[2:] + self.pads[:2]


class OffByRelativeConv(Im2colConv):
    """The forward off by 1e-3 relative."""

    def forward(self, *inputs):
        return super().forward(*inputs) * (1 + 1e-3)


class ScaledGradientConv(Im2colConv):
    """Every gradient (dX, dW, dB) off by `error` relative: a bug as small as a wrong constant
    in the last digits, e.g. 1 - 5e-6 for 1 (a subclass sets `error`)."""

    error = 5e-6

    def backward(self, grad_outputs, inputs, outputs):
        return tuple(g * (1 + self.error) for g in super().backward(grad_outputs, inputs,
                                                                    outputs))
