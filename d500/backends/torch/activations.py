"""Activation torch ops (Relu, Sigmoid, Gelu, ...) and Dropout."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d500.backends.graph import registry

OPS, op = registry()


@op
def Relu(node, x):
    return torch.relu(x)


@op
def LeakyRelu(node, x):
    return F.leaky_relu(x, node.attr("alpha", 0.01))


@op
def PRelu(node, x, slope):
    return torch.where(x < 0, x * slope, x)


@op
def Elu(node, x):
    return F.elu(x, node.attr("alpha", 1.0))


@op
def Selu(node, x):
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@op
def Celu(node, x):
    return F.celu(x, node.attr("alpha", 1.0))


@op
def Sigmoid(node, x):
    return torch.sigmoid(x)


@op
def HardSigmoid(node, x):
    return torch.clamp(node.attr("alpha", 0.2) * x + node.attr("beta", 0.5), 0, 1)


@op
def HardSwish(node, x):
    return F.hardswish(x)


@op
def Tanh(node, x):
    return torch.tanh(x)


@op
def Softplus(node, x):
    return torch.log1p(torch.exp(-x.abs())) + torch.relu(x)


@op
def Softsign(node, x):
    return x / (1 + x.abs())


@op
def ThresholdedRelu(node, x):
    return torch.where(x > node.attr("alpha", 1.0), x, torch.zeros_like(x))


@op
def Gelu(node, x):
    return F.gelu(x, approximate=node.attr("approximate", "none"))


@op
def Mish(node, x):
    return F.mish(x)


@op
def Swish(node, x):
    return x * torch.sigmoid(node.attr("alpha", 1.0) * x)


@op
def Shrink(node, x):
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    zero = torch.zeros_like(x)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


@op
def Dropout(node, x, ratio=None, training_mode=None):
    if node.opset < 12:
        ratio = node.attr("ratio", 0.5)
        training = False
    else:
        ratio = 0.5 if ratio is None else float(ratio)
        training = training_mode is not None and bool(training_mode)
    if training and ratio > 0:
        mask = torch.rand_like(x, dtype=torch.float32) >= ratio
        return x * mask / (1 - ratio), mask
    return x.clone() if len(node.outputs) < 2 else (
        x.clone(), torch.ones_like(x, dtype=torch.bool))
