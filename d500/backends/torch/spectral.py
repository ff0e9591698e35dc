"""Signal-processing torch ops: DFT, STFT (torch.fft) and MelWeightMatrix."""

from __future__ import annotations

import torch

from d500.backends import spectral
from d500.backends.graph import registry
from d500.backends.torch import dtypes
from d500.backends.torch.table import constant

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
    axis, n, inverse, onesided = spectral.dft_plan(
        node, x.shape, None if axis is None else int(axis.item()),
        None if dft_length is None else int(dft_length.item()))
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
    out = spectral.mel_weight_matrix(bins, n, rate, low, high)
    target = node.attr("output_datatype", 1)
    return constant(node, out.astype(dtypes.np_dtype(target)))
