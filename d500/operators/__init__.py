"""Level 0: a custom operator (NumPy, PyTorch, TensorFlow or C/C++) validated and benchmarked
against the ONNX reference (`d500 op validate|bench`)."""

from __future__ import annotations

from d500.operators.base import CustomOperator

__all__ = ["CustomOperator"]
