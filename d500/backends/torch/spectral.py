"""Signal-processing torch ops: DFT, STFT (torch.fft) and MelWeightMatrix."""

from __future__ import annotations

import math

import numpy as np
import torch

from d500.backends.graph import registry
from d500.backends.torch import dtypes
from d500.backends.torch.table import axis_of, constant

OPS, op = registry()


def _complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] (real, imaginary) as a complex128 tensor without the last dim.

    Double precision throughout, as ONNX's reference computes it (float32 FFTs miss its
    tolerances on near-zero bins)."""
    x = x.to(torch.float64)
    if x.shape[-1] == 1:
        return x[..., 0].to(torch.complex128)
    return torch.complex(x[..., 0], x[..., 1])


def _real_pair(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([y.real, y.imag], dim=-1).to(dtype)


@op
def DFT(node, x, dft_length=None, axis=None):
    if node.opset < 20:
        axis = node.attr("axis", 1)
    else:
        axis = -2 if axis is None else int(axis.item())
    axis = axis_of(axis, x.dim())
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if dft_length is not None:
        n = int(dft_length.item())
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    signal = _complex(x)
    if inverse:
        if onesided:
            return torch.fft.irfft(signal, n=n, dim=axis).unsqueeze(-1).to(x.dtype)
        return _real_pair(torch.fft.ifft(signal, n=n, dim=axis), x.dtype)
    y = torch.fft.fft(signal, n=n, dim=axis)
    if onesided:
        y = y.narrow(axis, 0, n // 2 + 1)
    return _real_pair(y, x.dtype)


@op
def STFT(node, x, frame_step, window=None, frame_length=None):
    if frame_length is not None:
        length = int(frame_length.item())
    else:
        length = window.shape[0] if window is not None else x.shape[-2]
    step = int(frame_step.item())
    frames = _complex(x).unfold(1, length, step)  # batch, frames, length
    if window is not None:
        frames = frames * window.to(torch.float64)
    y = torch.fft.fft(frames, dim=-1)
    if node.attr("onesided", 1):
        y = y[..., :length // 2 + 1]
    return _real_pair(y, x.dtype)


@op
def MelWeightMatrix(node, num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    bins, n, rate = int(num_mel_bins.item()), int(dft_length.item()), int(sample_rate.item())
    low, high = float(lower_hz.item()), float(upper_hz.item())
    low_mel = 2595 * math.log1p(low / 700) / math.log(10)
    high_mel = 2595 * math.log1p(high / 700) / math.log(10)
    points = np.arange(bins + 2) * (high_mel - low_mel) / (bins + 2) + low_mel
    points = 700 * np.expm1(points / 2595 * math.log(10))
    points = (((n + 1) * points) // rate).astype(int)
    out = np.zeros((n // 2 + 1, bins))
    for i in range(bins):
        left, center, right = points[i:i + 3]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    target = node.attr("output_datatype", 1)
    return constant(node, out.astype(dtypes.np_dtype(target)))
