"""Signal operators in TensorFlow: DFT, STFT (complex values as a trailing [re, im] axis)."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ints, norm_axis

OPS, op = registry()


def _complex(x):
    if x.shape[-1] == 1:
        return tf.complex(x[..., 0], tf.zeros_like(x[..., 0]))
    return tf.complex(x[..., 0], x[..., 1])


def _pair(z, dtype):
    return tf.cast(tf.stack([tf.math.real(z), tf.math.imag(z)], -1), dtype)


def _fft_last(z, length, inverse, onesided):
    n = z.shape[-1]
    if length is not None and length != n:
        if length < n:
            z = z[..., :length]
        else:
            z = tf.pad(z, [[0, 0]] * (z.shape.rank - 1) + [[0, length - n]])
    z = tf.signal.ifft(z) if inverse else tf.signal.fft(z)
    if onesided:
        z = z[..., :z.shape[-1] // 2 + 1]
    return z


@op
def DFT(node, x, dft_length=None, axis=None):
    r = x.shape.rank
    if node.opset >= 20:
        a = -2 if axis is None else ints(axis, node, "axis")[0]
    else:
        a = node.attr("axis", 1)
    a = norm_axis(a, r)  # counts the trailing [re, im] axis
    length = None if dft_length is None else ints(dft_length, node, "dft_length")[0]
    z = _complex(tf.cast(x, tf.float64))  # double precision, as the reference's NumPy FFT
    perm = [i for i in range(r - 1) if i != a] + [a]
    inv = [perm.index(i) for i in range(r - 1)]
    z = tf.transpose(z, perm)
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if inverse and onesided:  # one-sided spectrum -> full real signal
        n = length or 2 * (z.shape[-1] - 1)
        real = tf.signal.irfft(z, fft_length=[n])
        return tf.cast(tf.transpose(real, inv)[..., tf.newaxis], x.dtype)
    z = _fft_last(z, length, inverse, onesided)
    return _pair(tf.transpose(z, inv), x.dtype)


@op
def STFT(node, signal, frame_step, window=None, frame_length=None):
    step = ints(frame_step, node, "frame_step")[0]
    length = (ints(frame_length, node, "frame_length")[0] if frame_length is not None
              else window.shape[0])
    work = tf.float64
    z = _complex(tf.cast(signal, work))  # [batch, samples]
    frames = tf.signal.frame(z, length, step, axis=-1)  # [batch, frames, length]
    if window is not None:
        frames = frames * tf.cast(tf.complex(tf.cast(window, work), tf.zeros_like(
            tf.cast(window, work))), frames.dtype)
    out = _fft_last(frames, None, False, bool(node.attr("onesided", 1)))
    return _pair(out, signal.dtype)


@op
def MelWeightMatrix(node, num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    """Triangular mel filters [dft_length // 2 + 1, num_mel_bins], built at trace time."""
    import numpy as np

    from d500.backends.tensorflow.core import static, tf_dtype
    mels, length, rate = (int(np.asarray(static(v)).reshape(-1)[0])
                          for v in (num_mel_bins, dft_length, sample_rate))
    lo, hi = (float(np.asarray(static(v)).reshape(-1)[0]) for v in (lower_hz, upper_hz))
    bins = np.arange(mels + 2)
    low_mel = 2595 * np.log1p(lo / 700) / np.log(10)
    high_mel = 2595 * np.log1p(hi / 700) / np.log(10)
    step = (high_mel - low_mel) / bins.shape[0]
    hz = 700 * np.expm1((bins * step + low_mel) / 2595 * np.log(10))
    edges = (((length + 1) * hz) // rate).astype(int)
    out = np.zeros((length // 2 + 1, mels))
    for i in range(mels):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return tf.constant(out, tf_dtype(node.attr("output_datatype", 1), node))
