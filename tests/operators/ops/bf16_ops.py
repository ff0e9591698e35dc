"""NumPy operators for bfloat16 (ml_dtypes) and float16 inputs: correct ones compute in float32 (or
wider) and return the input's dtype, as bf16 kernels do; the broken ones round through float8 or
get a gradient wrong."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from d500.operators import CustomOperator


def _wide(x: np.ndarray) -> np.ndarray:
    """x in float32 (float64 stays float64): where the arithmetic happens."""
    return x if x.dtype == np.float64 else x.astype(np.float32)


class Bf16Sigmoid(CustomOperator):
    op_type = "Sigmoid"

    def forward(self, x):
        with np.errstate(over="ignore"):  # exp(-x) = inf at large negative x: 1 / inf = 0
            return (1 / (1 + np.exp(-_wide(x)))).astype(x.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        y = _wide(y)
        return ((_wide(g) * y * (1 - y)).astype(g.dtype),)


class Bf16MatMul(CustomOperator):
    op_type = "MatMul"

    def forward(self, a, b):
        return np.matmul(_wide(a), _wide(b)).astype(a.dtype)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (a, b) = grad_outputs, inputs
        g, a32, b32 = _wide(g), _wide(a), _wide(b)
        da = np.matmul(g, np.swapaxes(b32, -1, -2))
        db = np.matmul(np.swapaxes(a32, -1, -2), g)
        db = db.reshape(-1, *b.shape).sum(axis=0)  # b broadcast over the batch
        return da.astype(a.dtype), db.astype(b.dtype)


class Float8Sigmoid(Bf16Sigmoid):
    """Rounds its result through float8 e4m3 (3 significand bits, about 6% steps)."""

    def forward(self, x):
        return super().forward(x).astype(ml_dtypes.float8_e4m3fn).astype(x.dtype)


class FirstBatchMatMul(Bf16MatMul):
    """dB from the first batch entry only, scaled by the batch size: right only if every batch
    entry were the same."""

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (a, b) = grad_outputs, inputs
        da, _ = super().backward(grad_outputs, inputs, outputs)
        first = np.matmul(np.swapaxes(_wide(a), -1, -2)[0], _wide(g)[0]) * a.shape[0]
        return da, first.astype(b.dtype)
