"""A deliberately broken variant of the torch Softmax submission: dX wrong in every 25th element."""

from __future__ import annotations

from pathlib import Path

from d500.operators.base import load_class

ROOT = Path(__file__).resolve().parents[3]
TorchSoftmax = load_class(ROOT / "submissions/torch-softmax/softmax.py", "TorchSoftmax").cls


class WrongGradientSoftmax(TorchSoftmax):
    def backward(self, grad_outputs, inputs, outputs):
        (dx,) = super().backward(grad_outputs, inputs, outputs)
        flat = dx.reshape(-1).clone()
        flat[::25] *= 1.1
        return (flat.reshape(dx.shape),)
