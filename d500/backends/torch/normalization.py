"""Normalization torch ops: batch (inference and training form), instance, layer and Lp
normalization, LRN."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d500.backends.graph import registry
from d500.backends.torch.table import axis_of

OPS, op = registry()


class _BatchNormStats(torch.autograd.Function):
    """Inference batch norm differentiable also in its running statistics (ONNX parameters).

    torch's fused kernels compute the gradients of x, scale and bias; those of mean and var
    follow from them: dmean = -dbias * scale / std and dvar = -dscale * scale / (2 std^2).
    """

    @staticmethod
    def forward(ctx, x, scale, bias, mean, var, eps):
        ctx.save_for_backward(x, scale, mean, var)
        ctx.eps = eps
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx, grad):
        x, scale, mean, var = ctx.saved_tensors
        need = ctx.needs_input_grad
        stats = need[3] or need[4]
        gx, gscale, gbias = torch.ops.aten.native_batch_norm_backward(
            grad, x, scale, mean, var, None, None, False, ctx.eps,
            [need[0], need[1] or stats, need[2] or stats])
        var_eps = var + ctx.eps
        gmean = -gbias * scale * torch.rsqrt(var_eps) if need[3] else None
        gvar = -0.5 * gscale * scale / var_eps if need[4] else None
        return (gx, gscale if need[1] else None, gbias if need[2] else None, gmean, gvar, None)


@op
def BatchNormalization(node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    if node.opset < 9 and not node.attr("spatial", 1):
        # BN-7 spatial=0: scale, B, mean and var are (C, D1, ..., Dn), statistics over the batch
        # axis only: the batch norm of x flattened to (N, C*D1*...*Dn)
        y = _inference(x.flatten(1), *(v.reshape(-1) for v in (scale, bias, mean, var)), eps)
        return y.reshape(x.shape)
    if node.opset >= 14 and node.attr("training_mode", 0):
        # Normalised by the batch's mean and population variance in torch's fused training
        # kernel (one pass for the statistics, one kernel backward), whose saved statistics give
        # the running updates: the population variance is 1 / invstd^2 - eps, as ONNX wants it
        # (torch's own BatchNorm2d would use the unbiased one; torch.var_mean over N, H, W costs
        # as much as the whole kernel). The running outputs carry no gradient, as in the
        # reference's VJP.
        momentum = node.attr("momentum", 0.9)
        if x.numel() == x.shape[1]:  # one value per channel: y is the bias exactly
            dims = [0, *range(2, x.dim())]
            batch_mean, batch_var = x.mean(dim=dims), x.var(dim=dims, unbiased=False)
            y = F.batch_norm(x, batch_mean, batch_var, scale, bias, False, 0.0, eps)
        else:
            y, batch_mean, invstd = torch.ops.aten.native_batch_norm(
                x, scale, bias, None, None, True, 0.0, eps)
            batch_var = invstd.detach().pow(-2) - eps
        with torch.no_grad():
            return (y, mean * momentum + batch_mean.to(mean.dtype) * (1 - momentum),
                    var * momentum + batch_var.to(var.dtype) * (1 - momentum))
    return _inference(x, scale, bias, mean, var, eps)


def _inference(x, scale, bias, mean, var, eps):
    """Batch norm by the given statistics (per channel: axis 1), differentiable in all of them."""
    if (mean.requires_grad or var.requires_grad) and torch.is_grad_enabled():
        return _BatchNormStats.apply(x, scale, bias, mean, var, eps)
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)


@op
def InstanceNormalization(node, x, scale, bias):
    return F.instance_norm(x, weight=scale, bias=bias, eps=node.attr("epsilon", 1e-5))


@op
def LayerNormalization(node, x, scale, bias=None):
    axis = axis_of(node.attr("axis", -1), x.dim())
    eps = node.attr("epsilon", 1e-5)
    shape = tuple(x.shape[axis:])
    extra = len([o for o in node.outputs[1:] if o])
    if not extra and tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        return F.layer_norm(x, shape, scale, bias, eps)
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    if node.attr("stash_type", 1) != 1:
        compute = x.dtype
    xc = x.to(compute)
    dims = tuple(range(axis, x.dim()))
    mean = xc.mean(dim=dims, keepdim=True)
    inv = torch.rsqrt(((xc - mean) ** 2).mean(dim=dims, keepdim=True) + eps)
    y = ((xc - mean) * inv).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


@op
def LpNormalization(node, x):
    p = node.attr("p", 2)
    axis = node.attr("axis", -1)
    norm = x.abs().pow(p).sum(dim=axis, keepdim=True).pow(1.0 / p)
    return torch.where(norm == 0, torch.zeros_like(x), x / norm)


@op
def LRN(node, x):
    return F.local_response_norm(x, node.attr("size"), node.attr("alpha", 1e-4),
                                 node.attr("beta", 0.75), node.attr("bias", 1.0))
