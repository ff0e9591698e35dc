"""The PyTorch backend: ONNX graphs translated into torch operations, one function per ONNX op."""

from __future__ import annotations

from d500.backends.torch.executable import OPS, TorchBackend, TorchExecutable

__all__ = ["OPS", "TorchBackend", "TorchExecutable"]
