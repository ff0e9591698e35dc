"""The ai.onnx.preview.training optimizer operators in torch: Adagrad, Adam, Momentum (ONNX ops,
not d500's level-2 training), the formulas of d500/backends/preview_training.py."""

from __future__ import annotations

import torch

from d500.backends.graph import registry
from d500.backends.preview_training import Arrays, register

OPS, op = registry("ai.onnx.preview.training")
register(op, Arrays(sqrt=torch.sqrt, where=torch.where,
                    wide=lambda t: torch.as_tensor(t, dtype=torch.float64),
                    cast=lambda x, like: x.to(like.dtype)))
