"""Signal-processing JAX ops: DFT, STFT (jnp.fft) and MelWeightMatrix."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from d500.backends import spectral
from d500.backends.graph import registry
from d500.backends.jax.core import dtype_of, ints, static

OPS, op = registry()


def _complex(x):
    """[..., 1] real or [..., 2] (real, imaginary) as a complex128 tensor without the last dim.

    Double precision throughout, as ONNX's reference computes it (float32 FFTs miss its
    tolerances on near-zero bins)."""
    x = x.astype(jnp.float64)
    if x.shape[-1] == 1:
        return x[..., 0].astype(jnp.complex128)
    return x[..., 0] + 1j * x[..., 1]


def _real_pair(y, dtype):
    return jnp.stack([y.real, y.imag], axis=-1).astype(dtype)


@op
def DFT(node, x, dft_length=None, axis=None):
    axis, n, inverse, onesided = spectral.dft_plan(
        node, x.shape, None if axis is None else ints(axis, "axis")[0],
        None if dft_length is None else ints(dft_length, "dft length")[0])
    signal = _complex(x)
    if inverse:
        if onesided:
            return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
        return _real_pair(jnp.fft.ifft(signal, n=n, axis=axis), x.dtype)
    y = jnp.fft.fft(signal, n=n, axis=axis)
    if onesided:
        y = jnp.take(y, jnp.arange(n // 2 + 1), axis=axis)
    return _real_pair(y, x.dtype)


@op
def STFT(node, x, frame_step, window=None, frame_length=None):
    if frame_length is not None:
        length = ints(frame_length, "frame length")[0]
    else:
        length = window.shape[0] if window is not None else x.shape[-2]
    step = ints(frame_step, "frame step")[0]
    signal = _complex(x)
    starts = np.arange(0, signal.shape[1] - length + 1, step)
    frames = signal[:, starts[:, None] + np.arange(length)[None, :]]  # batch, frames, length
    if window is not None:
        frames = frames * window.astype(jnp.float64)
    y = jnp.fft.fft(frames, axis=-1)
    if node.attr("onesided", 1):
        y = y[..., :length // 2 + 1]
    return _real_pair(y, x.dtype)


def _value(x):
    value = static(x)
    if value is None:
        from d500.backends.jax.core import NotStatic
        raise NotStatic("MelWeightMatrix input")
    return value.reshape(-1)[0]


@op
def MelWeightMatrix(node, num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    bins, n, rate = (ints(v, "MelWeightMatrix input")[0] for v in (num_mel_bins, dft_length,
                                                                  sample_rate))
    low, high = (float(_value(v)) for v in (lower_hz, upper_hz))
    out = spectral.mel_weight_matrix(bins, n, rate, low, high)
    target = node.attr("output_datatype", 1)
    return jnp.asarray(out.astype(dtype_of(target)))
