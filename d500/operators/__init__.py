"""Level 0: a custom operator (NumPy, PyTorch, TensorFlow or C/C++) validated and benchmarked
against the ONNX reference (`d500 op validate|bench`)."""

from __future__ import annotations

from typing import Any

__all__ = ["CustomOperator"]


def __getattr__(name: str) -> Any:
    # Lazy, so `d500 --help` (which reads this package's level module) stays instant.
    if name == "CustomOperator":
        from d500.operators.base import CustomOperator
        return CustomOperator
    raise AttributeError(name)
