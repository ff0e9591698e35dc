"""Correct torch implementations (autograd gradients) of every level-0 operator: the validator must
pass each of them on every case (no false alarms on kinks, ties, broadcasting or ranges)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d500.operators import CustomOperator


class TorchOp(CustomOperator):
    framework = "torch"


class Conv(TorchOp):
    op_type = "Conv"

    def forward(self, x, w, b=None):
        a = self.attributes
        p = a.get("pads", [0, 0, 0, 0])
        x = F.pad(x, (p[1], p[3], p[0], p[2]))
        return F.conv2d(x, w, b, stride=a.get("strides", 1), dilation=a.get("dilations", 1),
                        groups=a.get("group", 1))


class Gemm(TorchOp):
    op_type = "Gemm"

    def forward(self, a, b, c=None):
        at = self.attributes
        a = a.T if at.get("transA", 0) else a
        b = b.T if at.get("transB", 0) else b
        y = at.get("alpha", 1.0) * (a @ b)
        return y if c is None else y + at.get("beta", 1.0) * c


class MatMul(TorchOp):
    op_type = "MatMul"

    def forward(self, a, b):
        return torch.matmul(a, b)


class Relu(TorchOp):
    op_type = "Relu"

    def forward(self, x):
        return torch.relu(x)


class Sigmoid(TorchOp):
    op_type = "Sigmoid"

    def forward(self, x):
        return torch.sigmoid(x)


class Softmax(TorchOp):
    op_type = "Softmax"

    def forward(self, x):
        return torch.softmax(x, dim=self.attributes.get("axis", -1))


class MaxPool(TorchOp):
    op_type = "MaxPool"

    def forward(self, x):
        a = self.attributes
        p = a.get("pads", [0, 0, 0, 0])
        x = F.pad(x, (p[1], p[3], p[0], p[2]), value=-float("inf"))
        return F.max_pool2d(x, a["kernel_shape"], a.get("strides", 1))


class AveragePool(TorchOp):
    op_type = "AveragePool"

    def forward(self, x):
        a = self.attributes
        p = a.get("pads", [0, 0, 0, 0])
        ones = torch.ones_like(x[:1, :1])
        pad = (p[1], p[3], p[0], p[2])
        total = F.avg_pool2d(F.pad(x, pad), a["kernel_shape"], a.get("strides", 1))
        if a.get("count_include_pad", 0):
            return total
        count = F.avg_pool2d(F.pad(ones, pad), a["kernel_shape"], a.get("strides", 1))
        return total / count  # padding excluded from the count


class BatchNormalization(TorchOp):
    op_type = "BatchNormalization"

    def forward(self, x, scale, bias, mean, var):
        shape = (1, -1) + (1,) * (x.dim() - 2)
        eps = self.attributes.get("epsilon", 1e-5)
        return ((x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)
                * scale.reshape(shape) + bias.reshape(shape))


class LayerNormalization(TorchOp):
    op_type = "LayerNormalization"

    def forward(self, x, scale, bias=None):
        axis = self.attributes.get("axis", -1) % x.dim()
        return F.layer_norm(x, x.shape[axis:], scale, bias, self.attributes.get("epsilon", 1e-5))


class Add(TorchOp):
    op_type = "Add"

    def forward(self, a, b):
        return a + b


class Tanh(TorchOp):
    op_type = "Tanh"

    def forward(self, x):
        return torch.tanh(x)


class Softplus(TorchOp):
    op_type = "Softplus"

    def forward(self, x):
        return F.softplus(x)


class Erf(TorchOp):
    op_type = "Erf"

    def forward(self, x):
        return torch.erf(x)


class Exp(TorchOp):
    op_type = "Exp"

    def forward(self, x):
        return torch.exp(x)


class Log(TorchOp):
    op_type = "Log"

    def forward(self, x):
        return torch.log(x)


class Pow(TorchOp):
    op_type = "Pow"

    def forward(self, a, b):
        return torch.pow(a, b)


class Clip(TorchOp):
    op_type = "Clip"

    def forward(self, x, lo=None, hi=None):
        if lo is not None:
            x = torch.maximum(x, lo)
        return x if hi is None else torch.minimum(x, hi)


class HardSigmoid(TorchOp):
    op_type = "HardSigmoid"

    def forward(self, x):
        a = self.attributes
        return torch.clamp(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0.0, 1.0)


BY_OP = {cls.op_type: cls for cls in TorchOp.__subclasses__()}
