"""Neural-network torch ops: convolutions, pooling, normalization, activations, softmax, dropout."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from d500.backends.graph import registry
from d500.backends.torch.table import axis_of, ints

OPS, op = registry()

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _spatial(node, x, kernel: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) of a conv/pool node for input `x`."""
    n = len(kernel)
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return strides, dilations, begin, end
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    pads = node.attr("pads") or [0] * (2 * n)
    return strides, dilations, list(pads[:n]), list(pads[n:])


def _pad_spatial(x, begin, end, value=0.0):
    pads = []
    for b, e in zip(reversed(begin), reversed(end)):
        pads += [b, e]
    return F.pad(x, pads, value=value) if any(pads) else x


# -- convolution --------------------------------------------------------------------------------
@op
def Conv(node, x, w, b=None):
    kernel = list(w.shape[2:])
    strides, dilations, begin, end = _spatial(node, x, kernel)
    group = node.attr("group", 1)
    if begin != end:
        x, begin = _pad_spatial(x, begin, end), [0] * len(begin)
    conv = _CONV.get(len(kernel))
    if conv is None:
        raise node.unsupported(f"{len(kernel)}-D convolution")
    return conv(x, w, b, strides, begin, dilations, group)


@op
def ConvTranspose(node, x, w, b=None):
    n = x.dim() - 2
    kernel = list(w.shape[2:])
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    out_pad = node.attr("output_padding") or [0] * n
    group = node.attr("group", 1)
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.attr("output_shape")
    full = [s * (i - 1) + (k - 1) * d + 1 + p
            for i, k, s, d, p in zip(x.shape[2:], kernel, strides, dilations, out_pad)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [i * s for i, s in zip(x.shape[2:], strides)])
        totals = [f - t for f, t in zip(full, target)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in totals]
        elif auto_pad == "SAME_LOWER":
            begin = [t - t // 2 for t in totals]
        else:  # explicit output_shape: the output starts at the first full position
            begin = [0] * n
        end = [t - bg for t, bg in zip(totals, begin)]
    else:
        pads = node.attr("pads") or [0] * (2 * n)
        begin, end = list(pads[:n]), list(pads[n:])
    conv = _CONV_T.get(n)
    if conv is None:
        raise node.unsupported(f"{n}-D transposed convolution")
    if begin == end and all(p < s or p < d for p, s, d in zip(out_pad, strides, dilations)) \
            and min(begin) >= 0:
        return conv(x, w, b, strides, begin, out_pad, group, dilations)
    y = conv(x, w, None, strides, 0, 0, group, dilations)
    y = _pad_spatial(y, [-p for p in begin], [p - e for p, e in zip(out_pad, end)])
    return y if b is None else y + b.reshape(-1, *[1] * n)


# -- pooling ---------------------------------------------------------------------------------------
def _pool_geometry(node, x):
    kernel = list(node.attr("kernel_shape"))
    strides, dilations, begin, end = _spatial(node, x, kernel)
    ceil = bool(node.attr("ceil_mode", 0))
    extra = []
    for size, k, s, d, b, e in zip(x.shape[2:], kernel, strides, dilations, begin, end):
        span = (k - 1) * d + 1
        out = (size + b + e - span) / s
        out = (math.ceil(out) if ceil else math.floor(out)) + 1
        if ceil and (out - 1) * s >= size + b:
            out -= 1
        extra.append((out - 1) * s + span - (size + b + e))
    return kernel, strides, dilations, begin, end, ceil, extra


def _windows(x, kernel, strides, dilations):
    """Sliding windows of a padded N,C,*spatial tensor: N,C,*out,*kernel."""
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        x = x.unfold(2 + i, (k - 1) * d + 1, s)
        if d > 1:
            x = x[..., ::d]
    return x


def _native_pool_ok(kernel, begin, end, ceil, extra) -> bool:
    return (begin == end and all(2 * p <= k for p, k in zip(begin, kernel))
            and len(kernel) in (1, 2, 3) and (ceil or all(e <= 0 for e in extra)))


@op
def MaxPool(node, x):
    kernel, strides, dilations, begin, end, ceil, extra = _pool_geometry(node, x)
    want_indices = len(node.outputs) > 1 and node.outputs[1]
    if _native_pool_ok(kernel, begin, end, ceil, extra) and not (
            x.dtype in (torch.int8, torch.uint8) and ceil):
        pool = _MAXPOOL[len(kernel)]
        if not want_indices:
            return pool(x, kernel, strides, begin, dilations, ceil)
        y, idx = pool(x, kernel, strides, begin, dilations, ceil, True)
        spatial = x.shape[2:]
        plane = math.prod(spatial)
        if node.attr("storage_order", 0) == 1:
            coords, rest = [], idx
            for size in reversed(spatial):
                coords.append(rest % size)
                rest = rest // size
            coords.reverse()
            idx, stride = torch.zeros_like(idx), 1
            for c, size in zip(coords, spatial):
                idx, stride = idx + c * stride, stride * size
        offset = torch.arange(x.shape[0] * x.shape[1], device=x.device) * plane
        idx = idx + offset.reshape(x.shape[0], x.shape[1], *[1] * len(spatial))
        return y, idx
    if want_indices:
        raise node.unsupported("indices output with asymmetric or large padding")
    low = -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min
    padded = _pad_spatial(x, begin, [e + max(x_, 0) for e, x_ in zip(end, extra)], low)
    win = _windows(padded, kernel, strides, dilations)
    return win.amax(dim=tuple(range(-len(kernel), 0)))


@op
def AveragePool(node, x):
    kernel, strides, dilations, begin, end, ceil, extra = _pool_geometry(node, x)
    include_pad = bool(node.attr("count_include_pad", 0))
    if _native_pool_ok(kernel, begin, end, ceil, extra) and all(d == 1 for d in dilations):
        return _AVGPOOL[len(kernel)](x, kernel, strides, begin, ceil, include_pad)
    more = [max(e, 0) for e in extra]
    padded = _pad_spatial(x, begin, [e + m for e, m in zip(end, more)])
    dims = tuple(range(-len(kernel), 0))
    total = _windows(padded, kernel, strides, dilations).sum(dim=dims)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if include_pad:
        ones = _pad_spatial(ones, begin, end, 1.0)
        count = _pad_spatial(ones, [0] * len(kernel), more)
    else:
        count = _pad_spatial(ones, begin, [e + m for e, m in zip(end, more)])
    count = _windows(count, kernel, strides, dilations).sum(dim=dims)
    return total / count


@op
def LpPool(node, x):
    kernel, strides, dilations, begin, end, _, extra = _pool_geometry(node, x)
    p = node.attr("p", 2)
    padded = _pad_spatial(x, begin, [e + max(m, 0) for e, m in zip(end, extra)])
    win = _windows(padded, kernel, strides, dilations)
    dims = tuple(range(-len(kernel), 0))
    return win.abs().pow(p).sum(dim=dims).pow(1.0 / p)


@op
def GlobalAveragePool(node, x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@op
def GlobalMaxPool(node, x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op
def GlobalLpPool(node, x):
    p = node.attr("p", 2)
    return x.abs().pow(p).sum(dim=tuple(range(2, x.dim())), keepdim=True).pow(1.0 / p)


@op
def MaxUnpool(node, x, indices, output_shape=None):
    n = x.dim() - 2
    kernel = list(node.attr("kernel_shape"))
    strides = node.attr("strides") or [1] * n
    pads = node.attr("pads") or [0] * (2 * n)
    shape = list(x.shape[:2]) + [
        (i - 1) * s + k - pads[d] - pads[d + n]
        for d, (i, k, s) in enumerate(zip(x.shape[2:], kernel, strides))]
    y = torch.zeros(math.prod(shape), dtype=x.dtype, device=x.device)
    y = y.index_put((indices.reshape(-1),), x.reshape(-1)).reshape(shape)
    if output_shape is not None:  # a larger output keeps the indices' coordinates
        target = ints(output_shape)
        y = F.pad(y, [p for t, s in zip(reversed(target), reversed(shape)) for p in (0, t - s)])
    return y


# -- normalization ---------------------------------------------------------------------------------
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


# -- activations -----------------------------------------------------------------------------------
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


# -- softmax family --------------------------------------------------------------------------------
def _softmax_like(node, x, fn):
    if node.opset >= 13:
        return fn(x, node.attr("axis", -1))
    axis = axis_of(node.attr("axis", 1), x.dim())
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return fn(flat, 1).reshape(x.shape)


@op
def Softmax(node, x):
    return _softmax_like(node, x, torch.softmax)


@op
def LogSoftmax(node, x):
    return _softmax_like(node, x, torch.log_softmax)


@op
def Hardmax(node, x):
    def hardmax(t, axis):
        return F.one_hot(t.argmax(dim=axis), t.shape[axis]).movedim(-1, axis).to(t.dtype)
    return _softmax_like(node, x, hardmax)


# -- losses ----------------------------------------------------------------------------------------
def _nll(node, log_prob, target, weight):
    reduction = node.attr("reduction", "mean")
    ignore = node.attr("ignore_index")
    target = target.to(torch.int64)
    if weight is None and ignore is None:
        return F.nll_loss(log_prob, target, reduction=reduction)  # one fused kernel each way
    valid = target != ignore if ignore is not None else torch.ones_like(target, dtype=torch.bool)
    safe = torch.where(valid, target, 0)
    loss = -log_prob.gather(1, safe.unsqueeze(1)).squeeze(1)
    if weight is not None:
        w = weight[safe] * valid
    elif ignore is not None and ignore != -1:  # (ONNX's reference: -1 is never masked here)
        w = valid.to(log_prob.dtype)
    else:
        w = None
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum() if w is not None else loss.mean()


@op
def NegativeLogLikelihoodLoss(node, x, target, weight=None):
    return _nll(node, x, target, weight)


@op
def SoftmaxCrossEntropyLoss(node, x, target, weight=None):
    log_prob = torch.log_softmax(x, dim=1)
    loss = _nll(node, log_prob, target, weight)
    return (loss, log_prob) if len(node.outputs) > 1 else loss
