"""Linear algebra and quantization in torch: MatMul, Gemm, Einsum, Det, integer and Q-linear ops."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from d500.backends import quantize
from d500.backends.graph import registry
from d500.backends.torch import dtypes
from d500.backends.torch.conv import Conv
from d500.backends.torch.table import axis_of

OPS, op = registry()


@op
def MatMul(node, a, b):
    if _onednn_linear(a, b):
        return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")
    if a.is_floating_point() or a.is_complex():
        return torch.matmul(a, b)
    return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)


WIDE = 8192  # output columns from which oneDNN's linear beats MKL's sgemm here


def _onednn_linear(a, b) -> bool:
    """Whether `a @ b` runs as oneDNN's linear on b's [N, K] storage: at inference (the
    executable's `run`), float32 on the CPU, b a 2-D matrix stored transposed (a tied output
    projection, `Transpose(embedding)`) with at least WIDE columns. MKL's sgemm, which
    torch.matmul calls, falls off as N grows on this AVX2 CPU: at [128, 768] x [768, N], 12-13
    GFLOP/s against oneDNN's 19-21 at N = 30,522 (BERT's vocabulary), 0.76x the time at N =
    8,192, no clear winner at N = 768 (benchmarks/matmul_kernels.py). Never where autograd
    records (oneDNN's linear has no backward); torch:compiled's inference trace, which runs
    with grad off, records it into its program (Inductor's frozen mm would pack the weight for
    MKL, as slow on this shape as sgemm)."""
    return (not torch.is_grad_enabled() and b.dim() == 2 and a.dim() >= 2
            and b.shape[1] >= WIDE and a.dtype == b.dtype == torch.float32
            and a.device.type == b.device.type == "cpu" and b.t().is_contiguous()
            and a.numel() > 0 and torch.backends.mkldnn.is_available())


@op
def Gemm(node, a, b, c=None):
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
    if trans_b and not trans_a and alpha == 1.0 and beta == 1.0 and (c is None or c.dim() <= 1):
        return F.linear(a, b, c)
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    y = a @ b
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y.to(a.dtype)


@op
def Einsum(node, *xs):
    return torch.einsum(node.attr("equation").replace(" ", ""), *xs)


@op
def Det(node, x):
    return torch.linalg.det(x)


# -- integer matmul and convolution --------------------------------------------------------------
def _centered(x, zero_point, axis=None):
    x = x.to(torch.int64) if not x.is_floating_point() else x
    if zero_point is None:
        return x
    zp = zero_point.to(x.dtype)
    if axis is not None and zp.numel() > 1:
        shape = [1] * x.dim()
        shape[axis] = -1
        zp = zp.reshape(shape)
    return x - zp


@op
def MatMulInteger(node, a, b, a_zero=None, b_zero=None):
    a = _centered(a, a_zero, 0 if a_zero is not None and a_zero.dim() else None)
    b = _centered(b, b_zero, b.dim() - 1 if b_zero is not None and b_zero.dim() else None)
    return torch.matmul(a.double(), b.double()).to(torch.int32)


@op
def ConvInteger(node, x, w, x_zero=None, w_zero=None):
    xc = _centered(x, x_zero).double()
    wc = _centered(w, w_zero, 0).double()
    return Conv(node, xc, wc).to(torch.int32)


def _scale_shape(x, scale, axis, block):
    """`scale` (or a zero point) broadcastable against `x`: scalar, per-axis or per-block."""
    if scale.dim() == 0 or scale.numel() == 1 and not block:
        return scale.reshape(())
    axis = axis_of(axis, x.dim())
    if block:
        return scale.repeat_interleave(block, dim=axis).narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return scale.reshape(shape)


@op
def DynamicQuantizeLinear(node, x):
    # float32 throughout, as the operator defines, and a divisor on the device: CUDA multiplies
    # by the reciprocal of a Python-number divisor, which rounded a value to 25 instead of 26.
    low = np.float32(min(x.min().item(), 0.0))
    high = np.float32(max(x.max().item(), 0.0))
    scale = np.float32((high - low) / np.float32(255.0))
    zero = float(np.clip(np.rint(-low / scale), 0, 255)) if scale else 0.0
    divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
    y = torch.round(x / divisor) + zero if scale else torch.zeros_like(x) + zero
    return (y.clamp(0, 255).to(torch.uint8), divisor,
            torch.tensor(zero, dtype=torch.uint8, device=x.device))


OPS.update(quantize.table(quantize.Kit(
    f64=lambda x: x.to(torch.float64), scale_shape=_scale_shape, matmul=torch.matmul,
    conv=Conv, round=torch.round, clip=torch.clamp, like=lambda y, ref: y.to(ref.dtype),
    f32=lambda x: x.to(torch.float32), onnx_type=lambda v: dtypes.NATURAL[v.dtype],
    cast=lambda node, y, to: dtypes.cast(y, to, bool(node.attr("saturate", 1))),
    stored=lambda node, y, to: y.to(dtypes.storage(to)))))
