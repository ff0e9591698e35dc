"""The NumPy reference backend: forward through onnx.reference.ReferenceEvaluator, backward through
a NumPy vector-Jacobian product per ONNX op (math, nn, reduce, shape: one function per op)."""

from __future__ import annotations

from d500.backends.reference.executable import VJP, ReferenceBackend, ReferenceExecutable

__all__ = ["VJP", "ReferenceBackend", "ReferenceExecutable"]
