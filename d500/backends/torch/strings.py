"""String ops and the classic ai.onnx.ml ops for torch: the shared NumPy ones (torch cannot hold
strings), plus those that stay on torch tensors."""

from __future__ import annotations

import numpy as np
import torch

from d500.backends import host_ops
from d500.backends.graph import registry
from d500.backends.torch.table import constant


def _device(node, array, like=None):
    value = constant(node, array)
    return value if like is None else value.to(like.dtype)


OPS, op = registry()
OPS.update(host_ops.table(host_ops.Io(lambda x: x.detach().cpu().numpy(), _device)))


def _ml(name: str):
    return lambda fn: OPS.setdefault(f"ai.onnx.ml::{name}", fn)


@_ml("Binarizer")
def Binarizer(node, x):
    return (x > node.attr("threshold", 0.0)).to(x.dtype)


@_ml("ArrayFeatureExtractor")
def ArrayFeatureExtractor(node, x, indices):
    if isinstance(x, np.ndarray):
        return np.take(x, indices.cpu().numpy().reshape(-1), axis=-1)
    picked = x.index_select(-1, indices.reshape(-1).to(torch.int64))
    return picked.reshape(1, -1) if x.dim() == 1 else picked
