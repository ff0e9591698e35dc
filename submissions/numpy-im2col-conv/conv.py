"""ONNX Conv (2-D) in NumPy by im2col: a strided window view and a batched matmul per group."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from d500.operators import CustomOperator


class Im2colConv(CustomOperator):
    op_type = "Conv"
    framework = "numpy"

    def __init__(self, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
                 kernel_shape=None, pads=None, strides=None):
        super().__init__(auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.auto_pad, self.group = auto_pad, int(group)
        self.dilations = list(dilations or [1, 1])
        self.strides = list(strides or [1, 1])
        self.pads = list(pads or [0, 0, 0, 0])
        self.kernel_shape = kernel_shape

    def _geometry(self, x: np.ndarray, w: np.ndarray):
        if x.ndim != 4:
            raise NotImplementedError("Im2colConv handles 2-D convolutions (4-D inputs) only")
        kh, kw = w.shape[2:]
        ek = [(k - 1) * d + 1 for k, d in zip((kh, kw), self.dilations)]
        pads = self.pads
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0, 0, 0, 0]
            for a, (size, s, e) in enumerate(zip(x.shape[2:], self.strides, ek)):
                total = max(0, (math.ceil(size / s) - 1) * s + e - size)
                small, large = total // 2, total - total // 2
                pads[a], pads[a + 2] = (small, large) if self.auto_pad == "SAME_UPPER" else (
                    large, small)
        elif self.auto_pad == "VALID":
            pads = [0, 0, 0, 0]
        out = [(size + pads[a] + pads[a + 2] - ek[a]) // self.strides[a] + 1
               for a, size in enumerate(x.shape[2:])]
        return (kh, kw), ek, pads, out

    def _columns(self, x: np.ndarray, w: np.ndarray):
        (kh, kw), ek, pads, (oh, ow) = self._geometry(x, w)
        xp = self._pad(x, pads)
        win = sliding_window_view(xp, ek, axis=(2, 3))
        win = win[:, :, ::self.strides[0], ::self.strides[1], ::self.dilations[0],
                  ::self.dilations[1]][:, :, :oh, :ow]
        n, c = x.shape[:2]
        g = self.group
        # (N, g, Cg, oh, ow, kh, kw) -> (g, Cg*kh*kw, N*oh*ow)
        cols = win.reshape(n, g, c // g, oh, ow, kh, kw).transpose(1, 2, 5, 6, 0, 3, 4)
        return np.ascontiguousarray(cols).reshape(g, (c // g) * kh * kw, n * oh * ow), (oh, ow)

    def _pad(self, x: np.ndarray, pads: list[int]) -> np.ndarray:
        return np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))

    def forward(self, x, w, b=None):
        cols, (oh, ow) = self._columns(x, w)
        g, m = self.group, w.shape[0]
        y = np.matmul(w.reshape(g, m // g, -1), cols)           # (g, Mg, N*oh*ow)
        y = y.reshape(m, x.shape[0], oh, ow).transpose(1, 0, 2, 3)
        if b is not None:
            y = y + b.reshape(1, m, 1, 1)
        return np.ascontiguousarray(y)

    def backward(self, grad_outputs, inputs, outputs):
        (dy,), (x, w, *rest) = grad_outputs, inputs
        cols, (oh, ow) = self._columns(x, w)
        g, m, n, c = self.group, w.shape[0], x.shape[0], x.shape[1]
        (kh, kw), _, pads, _ = self._geometry(x, w)
        dy_g = dy.transpose(1, 0, 2, 3).reshape(g, m // g, n * oh * ow)
        # one 2-D product per group: BLAS takes the transposed operands as they are
        wg = w.reshape(g, m // g, -1)
        dw = np.stack([dy_g[k] @ cols[k].T for k in range(g)]).reshape(w.shape)
        dcols = np.stack([wg[k].T @ dy_g[k] for k in range(g)])
        dcols = dcols.reshape(g, c // g, kh, kw, n, oh, ow)
        hp, wp = x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]
        dxp = np.zeros((n, c, hp, wp), dtype=x.dtype)
        sh, sw = self.strides
        dh, dw_ = self.dilations
        for i in range(kh):
            for j in range(kw):
                patch = dcols[:, :, i, j].transpose(2, 0, 1, 3, 4).reshape(n, c, oh, ow)
                dxp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                    j * dw_:j * dw_ + sw * (ow - 1) + 1:sw] += patch
        dx = dxp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]
        db = dy.sum(axis=(0, 2, 3)) if rest else None
        return (np.ascontiguousarray(dx), dw, *([db] if rest else []))
