"""Correct NumPy operators with hand-written backward passes, and variants whose bug lives only in
part of the input range: in the tails (|x| > 2), on negative inputs, on a padded border, or at
edge values. The validator must pass the first and fail every variant."""

from __future__ import annotations

from math import erf
from pathlib import Path

import numpy as np

from d500.operators import CustomOperator
from d500.operators.base import load_class

ROOT = Path(__file__).resolve().parents[3]
Im2colConv = load_class(ROOT / "submissions/numpy-im2col-conv/conv.py", "Im2colConv").cls


class Sigmoid(CustomOperator):
    op_type = "Sigmoid"

    def forward(self, x):
        e = np.exp(-np.abs(x))  # never overflows
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        return (g * y * (1 - y),)


class Tanh(CustomOperator):
    op_type = "Tanh"

    def forward(self, x):
        return np.tanh(x)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        return (g * (1 - y * y),)


class Softplus(CustomOperator):
    op_type = "Softplus"

    def forward(self, x):
        return np.logaddexp(0, x).astype(x.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (x,) = grad_outputs, inputs
        return (g * Sigmoid().forward(x),)


class Erf(CustomOperator):
    op_type = "Erf"

    def forward(self, x):
        return np.vectorize(erf, otypes=[np.float64])(x).astype(x.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (x,) = grad_outputs, inputs
        return (g * 2 / np.sqrt(np.pi) * np.exp(-x * x),)


class HardSigmoid(CustomOperator):
    op_type = "HardSigmoid"

    def __init__(self, alpha=0.2, beta=0.5):
        super().__init__(alpha=alpha, beta=beta)
        self.alpha, self.beta = alpha, beta

    def forward(self, x):
        return np.clip(self.alpha * x + self.beta, 0, 1).astype(x.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (x,) = grad_outputs, inputs
        z = self.alpha * x + self.beta
        return (g * self.alpha * ((z > 0) & (z < 1)),)


# -- bugs in the tails (|x| > 2): invisible on [-2, 2) -------------------------------------------
class TailGradientSigmoid(Sigmoid):
    """The derivative 10% off where |x| > 2."""

    def backward(self, grad_outputs, inputs, outputs):
        (dx,), (x,) = super().backward(grad_outputs, inputs, outputs), inputs
        return (np.where(np.abs(x) > 2, 1.1 * dx, dx),)


class FlatHardSigmoid(HardSigmoid):
    """The slope alpha everywhere, also where HardSigmoid is flat (|x| > 2.5)."""

    def backward(self, grad_outputs, inputs, outputs):
        (g,) = grad_outputs
        return (g * self.alpha,)


class ClampedTanh(Tanh):
    """The forward saturates at +-0.999 beyond |x| = 2 (an approximation fitted on [-2, 2])."""

    def forward(self, x):
        return np.where(np.abs(x) > 2, np.sign(x) * 0.999, np.tanh(x)).astype(x.dtype)


# -- bugs on negative inputs only -----------------------------------------------------------------
class NegativeGradientSoftplus(Softplus):
    """For x < 0 the derivative exp(x) instead of sigmoid(x) (right only as x -> -inf)."""

    def backward(self, grad_outputs, inputs, outputs):
        (dx,), (x,), (g,) = super().backward(grad_outputs, inputs, outputs), inputs, grad_outputs
        return (np.where(x < 0, g * np.exp(np.minimum(x, 0)), dx),)


class OddErf(Erf):
    """The forward erf(|x|): wrong sign on negative inputs."""

    def forward(self, x):
        return super().forward(np.abs(x))


# -- bugs on a padded border only -----------------------------------------------------------------
class BorderGradientConv(Im2colConv):
    """dX 2% off on the outermost ring of pixels (those whose windows reach into the padding)."""

    def backward(self, grad_outputs, inputs, outputs):
        dx, *rest = super().backward(grad_outputs, inputs, outputs)
        dx = dx.copy()
        for border in (dx[:, :, 0], dx[:, :, -1], dx[:, :, 1:-1, 0], dx[:, :, 1:-1, -1]):
            border *= 1.02
        return (dx, *rest)


class _EdgePadConv(Im2colConv):
    def _pad(self, x, pads):
        return np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), mode="edge")


class EdgePaddedWeightGradientConv(Im2colConv):
    """dW computed from the input padded by repeating its border (np.pad mode 'edge') instead of
    zeros: wrong only in the windows that overlap the padding; forward and dX are right."""

    def backward(self, grad_outputs, inputs, outputs):
        dx, _, *rest = super().backward(grad_outputs, inputs, outputs)
        _, dw, *_ = _EdgePadConv(**self.attributes).backward(grad_outputs, inputs, outputs)
        return (dx, dw, *rest)


# -- a bug at edge values only --------------------------------------------------------------------
class OverflowingSoftplus(Softplus):
    """The derivative as exp(x) / (1 + exp(x)): inf / inf = NaN once exp(x) overflows (x > 709
    in float64), right everywhere below."""

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (x,) = grad_outputs, inputs
        with np.errstate(over="ignore", invalid="ignore"):
            return (g * np.exp(x) / (1 + np.exp(x)),)


class LargeInputsGradientSoftplus(Softplus):
    """The derivative 2e-4 relative too large where |x| > 8 (only the inputs scaled x16 have
    such values): a small error spread over many elements."""

    def backward(self, grad_outputs, inputs, outputs):
        (dx,), (x,) = super().backward(grad_outputs, inputs, outputs), inputs
        return (np.where(np.abs(x) > 8, dx * (1 + 2e-4), dx),)
