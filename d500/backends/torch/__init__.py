"""The PyTorch backend: ONNX graphs translated into torch operations, one function per ONNX op.

Importing this package imports no torch: `FRAMEWORK` (framework.py) says what d500 knows about
it; torch is imported when the backend class (or the op table) is first asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from d500.backends.torch.framework import FRAMEWORK

__all__ = ["FRAMEWORK", "OPS", "TorchBackend", "TorchExecutable"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("d500.backends.torch.executable"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
