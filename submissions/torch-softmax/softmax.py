"""ONNX Softmax (opset 13: one axis, default -1) in PyTorch with a hand-written backward."""

from __future__ import annotations

from d500.operators import CustomOperator


class TorchSoftmax(CustomOperator):
    op_type = "Softmax"
    framework = "torch"

    def __init__(self, axis: int = -1):
        super().__init__(axis=axis)
        self.axis = int(axis)

    def forward(self, x):
        shifted = x - x.amax(dim=self.axis, keepdim=True)
        e = shifted.exp()
        return e / e.sum(dim=self.axis, keepdim=True)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        return (y * (g - (g * y).sum(dim=self.axis, keepdim=True)),)
