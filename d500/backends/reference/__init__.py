"""The NumPy reference backend: forward through onnx.reference.ReferenceEvaluator, backward through
a NumPy vector-Jacobian product per ONNX op (math, nn, reduce, shape: one function per op).

`FRAMEWORK` (framework.py) says what d500 knows about it; the backend itself is imported when
its class (or the VJP table) is first asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from d500.backends.reference.framework import FRAMEWORK

__all__ = ["FRAMEWORK", "VJP", "ReferenceBackend", "ReferenceExecutable"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("d500.backends.reference.executable"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
