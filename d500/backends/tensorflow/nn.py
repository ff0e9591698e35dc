"""Neural-network operators in TensorFlow: activations, softmax, convolution, pooling, norms.

ONNX is channels-first (NCHW); TensorFlow's CPU kernels are channels-last. Convolution and
pooling therefore return `ChannelsLast` values (NHWC inside), which the layout-aware operators
here and the elementwise ones keep (see ops.py), so a network transposes once on the way in
and once on the way out instead of around every convolution.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry
from d500.backends.tensorflow.core import ChannelsLast, norm_axis, plain, shape_list, to_last

OPS, op = registry()


def _c(x, value):
    return tf.constant(value, x.dtype)


# -- activations ----------------------------------------------------------------
@op
def Relu(node, x):
    return tf.nn.relu(x)


@op
def LeakyRelu(node, x):
    return tf.where(x >= 0, x, x * _c(x, node.attr("alpha", 0.01)))


@op
def PRelu(node, x, slope):
    return tf.where(x >= 0, x, x * slope)


@op
def Elu(node, x):
    alpha = _c(x, node.attr("alpha", 1.0))
    return tf.where(x > 0, x, alpha * (tf.exp(x) - 1))


@op
def Selu(node, x):
    alpha = _c(x, node.attr("alpha", 1.67326319217681884765625))
    gamma = _c(x, node.attr("gamma", 1.05070102214813232421875))
    return gamma * tf.where(x > 0, x, alpha * (tf.exp(x) - 1))


@op
def Celu(node, x):
    alpha = _c(x, node.attr("alpha", 1.0))
    return tf.maximum(x, 0) + tf.minimum(_c(x, 0), alpha * (tf.exp(x / alpha) - 1))


@op
def ThresholdedRelu(node, x):
    return tf.where(x > _c(x, node.attr("alpha", 1.0)), x, tf.zeros_like(x))


@op
def Sigmoid(node, x):
    return tf.sigmoid(x)


@op
def HardSigmoid(node, x):
    alpha, beta = _c(x, node.attr("alpha", 0.2)), _c(x, node.attr("beta", 0.5))
    return tf.clip_by_value(alpha * x + beta, _c(x, 0), _c(x, 1))


@op
def HardSwish(node, x):
    return x * tf.clip_by_value(x / 6 + _c(x, 0.5), _c(x, 0), _c(x, 1))


@op
def Softplus(node, x):
    return tf.nn.softplus(x)


@op
def Softsign(node, x):
    return x / (1 + tf.abs(x))


@op
def Mish(node, x):
    return x * tf.tanh(tf.nn.softplus(x))


@op
def Gelu(node, x):
    return tf.nn.gelu(x, approximate=node.attr("approximate", "none") == "tanh")


@op
def Swish(node, x):
    return x * tf.sigmoid(x * _c(x, node.attr("alpha", 1.0)))


@op
def Shrink(node, x):
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    xf = tf.cast(x, tf.float64)
    y = tf.where(xf < -lambd, xf + bias, tf.where(xf > lambd, xf - bias, tf.zeros_like(xf)))
    return tf.cast(y, x.dtype)


@op
def Dropout(node, x, ratio=None, training=None):
    from d500.backends.tensorflow.core import static
    if training is not None and bool(static(training)) and (
            ratio is None or float(static(ratio)) > 0):
        raise node.unsupported("training-mode Dropout is random; d500 runs it in inference mode")
    return x, tf.ones_like(x, tf.bool)


# -- softmax family ---------------------------------------------------------------
def _softmax_like(fn, node, x):
    if x.dtype in (tf.float16, tf.bfloat16):  # in float32, rounded once at the end
        return tf.cast(_softmax_like(fn, node, tf.cast(x, tf.float32)), x.dtype)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if node.opset >= 13:
        return fn(x, norm_axis(axis, x.shape.rank))
    shape = tf.shape(x)
    axis = norm_axis(axis, x.shape.rank)
    flat = tf.reshape(x, [tf.reduce_prod(shape[:axis]), -1])
    return tf.reshape(fn(flat, 1), shape)


def _hardmax(x, axis):
    return tf.one_hot(tf.argmax(x, axis), tf.shape(x)[axis], axis=axis, dtype=x.dtype)


@op
def Softmax(node, x):
    return _softmax_like(lambda v, a: tf.nn.softmax(v, axis=a), node, x)


@op
def LogSoftmax(node, x):
    return _softmax_like(lambda v, a: tf.nn.log_softmax(v, axis=a), node, x)


@op
def Hardmax(node, x):
    return _softmax_like(_hardmax, node, x)


# -- convolution --------------------------------------------------------------------
_to_last = to_last


def _rank(x):
    return x.t.shape.rank if isinstance(x, ChannelsLast) else x.shape.rank


def _spatial(x):
    return x.t.shape[1:-1] if isinstance(x, ChannelsLast) else x.shape[2:]


def _dtype(x):
    return x.t.dtype if isinstance(x, ChannelsLast) else x.dtype


def _pads(node, spatial, kernel, strides, dilations, ceil_mode=False):
    """Explicit (begin, end) pads per spatial axis from pads/auto_pad."""
    n = len(spatial)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return pads
    if auto == "VALID":
        return [(0, 0)] * n
    p = node.attr("pads") or [0] * (2 * n)
    return [(int(p[i]), int(p[i + n])) for i in range(n)]


def _tf_same(spatial, kernel, strides, dilations):
    """The (begin, end) pads of TensorFlow's padding="SAME" for this geometry."""
    pads = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def _conv_nhwc(x, w, strides, dilations, groups, pads):
    """Channels-last convolution with (begin, end) pads; w is [*k, cin/groups, cout].

    Pads that TF's "SAME" gives are passed as "SAME" (the fastest kernels, forward and
    backward); other pads become an explicit tf.pad and "VALID".
    """
    cin, n = x.shape[-1], len(strides)
    pads = [tuple(p) for p in pads]
    if not any(any(p) for p in pads):
        padding = "VALID"
    elif pads == _tf_same(x.shape[1:-1], w.shape[:n], strides, dilations):
        padding = "SAME"
    else:
        x, padding = tf.pad(x, [(0, 0), *pads, (0, 0)]), "VALID"
    if groups == 1:
        return tf.nn.convolution(x, w, strides=strides, dilations=dilations, padding=padding)
    if n == 2 and groups == cin and w.shape[-1] % groups == 0 and strides[0] == strides[1]:
        dw = tf.reshape(w, [*w.shape[:2], groups, w.shape[-1] // groups])
        return tf.nn.depthwise_conv2d(x, dw, [1, *strides, 1], padding, dilations=dilations)
    xs = tf.split(x, groups, axis=-1)
    ws = tf.split(w, groups, axis=-1)
    return tf.concat([tf.nn.convolution(a, b, strides=strides, dilations=dilations,
                                        padding=padding) for a, b in zip(xs, ws)], -1)


def conv(node, x, w, b=None, pads=None):
    """ONNX Conv (NC...) through TensorFlow's channels-last kernels."""
    n = _rank(x) - 2
    kernel = w.shape[2:]
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    groups = node.attr("group", 1)
    if pads is None:
        pads = _pads(node, _spatial(x), kernel, strides, dilations)
    if _dtype(x) not in (tf.float32, tf.float64, tf.float16, tf.bfloat16):
        raise node.unsupported(f"convolution of {_dtype(x).name}")
    xl = _to_last(x)
    if xl.dtype in (tf.float16, tf.bfloat16):  # accumulate in float32, round once
        half = xl.dtype
        y = conv(node, ChannelsLast(tf.cast(xl, tf.float32)), tf.cast(w, tf.float32),
                 None if b is None else tf.cast(b, tf.float32), pads)
        return ChannelsLast(tf.cast(y.t, half))
    wl = tf.transpose(w, [*range(2, n + 2), 1, 0])  # [*k, cin/g, cout]
    if n == 1:  # TF has no 1-D kernels of its own: go through 2-D
        y = _conv_nhwc(xl[:, tf.newaxis], wl[tf.newaxis], [1, *strides], [1, *dilations],
                       groups, [(0, 0), *pads])[:, 0]
    else:
        y = _conv_nhwc(xl, wl, list(strides), list(dilations), groups, list(pads))
    if b is not None:
        y = y + b
    return ChannelsLast(y)


@op
def Conv(node, x, w, b=None):
    return conv(node, x, w, b)


@op
def ConvTranspose(node, x, w, b=None):
    """A strided transposed convolution as a convolution of the zero-upsampled input."""
    n = x.shape.rank - 2
    groups = node.attr("group", 1)
    kernel = w.shape[2:]
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    out_pad = node.attr("output_padding") or [0] * n
    spatial = x.shape[2:]
    full = [(i - 1) * s + (k - 1) * d + 1 + op
            for i, s, k, d, op in zip(spatial, strides, kernel, dilations, out_pad)]
    pads = node.attr("pads")
    out_shape = node.attr("output_shape")
    auto = node.attr("auto_pad", "NOTSET")
    if out_shape:
        out_shape = list(out_shape)[-n:]
        totals = [f - o for f, o in zip(full, out_shape)]
        upper = auto == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        totals = [f - i * s for f, i, s in zip(full, spatial, strides)]
        pads = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2)
                for t in totals]
    elif pads:
        pads = [(int(pads[i]), int(pads[i + n])) for i in range(n)]
    else:
        pads = [(0, 0)] * n
    # upsample: insert s-1 zeros between input elements
    y = x
    for axis, s in enumerate(strides):
        if s > 1:
            ax = axis + 2
            shape = shape_list(y)
            z = tf.stack([y] + [tf.zeros_like(y)] * (s - 1), axis=ax + 1)
            shape[ax] = shape[ax] * s
            z = tf.reshape(z, shape)
            y = z[(slice(None),) * ax + (slice(0, shape[ax] - (s - 1)),)]
    # weights [cin, cout/g, *k] -> conv weights [cout, cin/g, *k], flipped
    cin, cout_g = w.shape[0], w.shape[1]
    wg = tf.reshape(w, [groups, cin // groups, cout_g, *kernel])
    wg = tf.transpose(wg, [0, 2, 1, *range(3, n + 3)])
    wc = tf.reverse(tf.reshape(wg, [groups * cout_g, cin // groups, *kernel]),
                    axis=list(range(2, n + 2)))
    conv_pads = [((k - 1) * d - pb, (k - 1) * d - pe + op)
                 for k, d, (pb, pe), op in zip(kernel, dilations, pads, out_pad)]
    crop = []
    for i, (pb, pe) in enumerate(conv_pads):  # negative pads crop the upsampled input
        crop.append((max(-pb, 0), max(-pe, 0)))
        conv_pads[i] = (max(pb, 0), max(pe, 0))
    if any(c != (0, 0) for c in crop):
        idx = [slice(None), slice(None)] + [
            slice(cb, (y.shape[i + 2] - ce)) for i, (cb, ce) in enumerate(crop)]
        y = y[tuple(idx)]

    class _Attrs:
        op_type, opset = node.op_type, node.opset

        def attr(self, name, default=None):
            return {"strides": [1] * n, "dilations": dilations, "group": groups}.get(
                name, default)

        unsupported = node.unsupported
    return conv(_Attrs(), y, wc, b, pads=conv_pads)


# -- pooling ----------------------------------------------------------------------------
def _pool_geometry(node, x):
    n = _rank(x) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    spatial = _spatial(x)
    pads = _pads(node, spatial, kernel, strides, dilations)
    ceil = node.attr("ceil_mode", 0)
    extra = []
    for size, k, s, d, (pb, pe) in zip(spatial, kernel, strides, dilations, pads):
        span = size + pb + pe - ((k - 1) * d + 1)
        out = (-(-span // s) if ceil else span // s) + 1
        if ceil and (out - 1) * s >= size + pb:  # the last window must start inside
            out -= 1
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (size + pb + pe), 0))
    return n, kernel, strides, dilations, pads, extra


def _window_reduce(x, kernel, strides, dilations, kind):
    """Reduce windows of channels-last x (VALID); 'MAX' or 'AVG' (sum/count) in TF's kernels."""
    n = len(kernel)
    if n == 1:
        y = _window_reduce(x[:, tf.newaxis], [1, *kernel], [1, *strides], [1, *dilations],
                           kind)
        return y[:, 0]
    if any(d > 1 for d in dilations) or any(s > k for s, k in zip(strides, kernel)):
        y = tf.nn.pool(x, kernel, kind, strides=[1] * n, padding="VALID",
                       dilations=dilations)
        return y[(slice(None), *[slice(None, None, s) for s in strides])]
    return tf.nn.pool(x, kernel, kind, strides=strides, padding="VALID")


@op
def MaxPool(node, x):
    if len(node.outputs) > 1 and node.outputs[1]:
        x = plain(x)
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    xl = _to_last(x)
    dtype = xl.dtype
    low = dtype.min if dtype.is_integer else -np.inf
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    if any(p != (0, 0) for p in padding):
        xl = tf.pad(xl, padding, constant_values=tf.constant(low, dtype))
    work = xl if dtype in (tf.float32, tf.float64, tf.float16) else tf.cast(xl, tf.float64)
    y = ChannelsLast(tf.cast(_window_reduce(work, kernel, strides, dilations, "MAX"), dtype))
    if len(node.outputs) > 1 and node.outputs[1]:
        y = y.nchw()
        return y, _argmax_indices(node, x, y, kernel, strides, dilations, pads, extra)
    return y


def _argmax_indices(node, x, y, kernel, strides, dilations, pads, extra):
    """Flat NCHW indices of each window's maximum (first occurrence), as ONNX MaxPool returns."""
    shape = x.shape.as_list()
    flat = np.arange(np.prod(shape), dtype=np.float64)  # indices into the whole tensor
    if node.attr("storage_order", 0):  # column-major spatial dimensions
        r = len(shape)
        flat = flat.reshape([shape[0] * shape[1], *shape[2:][::-1]]).transpose(
            [0, *range(r - 2, 0, -1)])
    idx = tf.reshape(tf.constant(flat), shape)
    low = np.inf
    padding = [(0, 0), (0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)]
    xp = tf.pad(tf.cast(x, tf.float64), padding, constant_values=-np.inf)
    ip = tf.pad(idx, padding, constant_values=low)
    patches_x, patches_i = [], []
    out = y.shape.as_list()[2:]
    import itertools
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                   for o, d, m, s in zip(offs, dilations, out, strides))
        patches_x.append(xp[(slice(None), slice(None), *sl)])
        patches_i.append(ip[(slice(None), slice(None), *sl)])
    px, pi = tf.stack(patches_x, -1), tf.stack(patches_i, -1)
    best = tf.argmax(px, -1)
    return tf.cast(tf.gather(pi, best, batch_dims=x.shape.rank), tf.int64)


@op
def AveragePool(node, x):
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    xl = _to_last(x)
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    include = node.attr("count_include_pad", 0)
    if not any(p != (0, 0) for p in padding):
        return ChannelsLast(_window_reduce(xl, kernel, strides, dilations, "AVG"))
    xp = tf.pad(xl, padding)
    spatial = _spatial(x)
    ones = np.zeros([1, *[s + pb + pe + e for s, (pb, pe), e in zip(spatial, pads, extra)], 1],
                    dtype=xl.dtype.as_numpy_dtype)
    if include:
        inner = tuple(slice(0, s + pb + pe) for s, (pb, pe) in zip(spatial, pads))
    else:
        inner = tuple(slice(pb, pb + s) for s, (pb, _) in zip(spatial, pads))
    ones[(0, *inner, 0)] = 1
    window = float(np.prod(kernel))
    sums = _window_reduce(xp, kernel, strides, dilations, "AVG") * window
    counts = _window_reduce(tf.constant(ones), kernel, strides, dilations, "AVG") * window
    return ChannelsLast(sums / counts)


@op
def LpPool(node, x):
    p = node.attr("p", 2)
    _, kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    padding = [(0, 0)] + [(pb, pe + e) for (pb, pe), e in zip(pads, extra)] + [(0, 0)]
    xl = tf.pad(tf.abs(_to_last(x)) ** p, padding)
    s = _window_reduce(xl, kernel, strides, dilations, "AVG") * float(np.prod(kernel))
    return ChannelsLast(s ** (1.0 / p))


@op
def GlobalAveragePool(node, x):
    if isinstance(x, ChannelsLast):
        return ChannelsLast(tf.reduce_mean(x.t, axis=list(range(1, x.t.shape.rank - 1)),
                                           keepdims=True))
    return tf.reduce_mean(x, axis=list(range(2, x.shape.rank)), keepdims=True)


@op
def GlobalMaxPool(node, x):
    if isinstance(x, ChannelsLast):
        return ChannelsLast(tf.reduce_max(x.t, axis=list(range(1, x.t.shape.rank - 1)),
                                          keepdims=True))
    return tf.reduce_max(x, axis=list(range(2, x.shape.rank)), keepdims=True)


@op
def GlobalLpPool(node, x):
    p = node.attr("p", 2)
    return tf.reduce_sum(tf.abs(x) ** p, axis=list(range(2, x.shape.rank)),
                         keepdims=True) ** (1.0 / p)


# -- normalization ---------------------------------------------------------------------------
def _per_channel(v, rank):
    return tf.reshape(v, [-1] + [1] * (rank - 2))


@op
def BatchNormalization(node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    training = node.attr("training_mode", 0) or (node.opset < 7 and not node.attr(
        "is_test", 0) and len(node.outputs) > 1)
    if isinstance(x, ChannelsLast) and not training:
        inv = scale * tf.math.rsqrt(var + tf.cast(eps, var.dtype))
        shift = bias - mean * inv
        return ChannelsLast(x.t * tf.cast(inv, x.t.dtype) + tf.cast(shift, x.t.dtype))
    if training:  # the batch's mean and population variance; the running outputs carry no
        # gradient (as in the reference's VJP)
        momentum = node.attr("momentum", 0.9)
        if isinstance(x, ChannelsLast) and x.t.shape.rank == 4 and x.t.dtype == tf.float32:
            # TF's fused NHWC kernel (half the time of moments + normalisation, forward and
            # backward); it returns the unbiased variance, made the population one
            y, bm, bv = tf.compat.v1.nn.fused_batch_norm(
                x.t, scale, bias, epsilon=eps, data_format="NHWC", is_training=True)
            n = tf.cast(tf.size(x.t) // tf.size(bv), bv.dtype)
            bv = tf.where(n > 1, bv * ((n - 1) / n), tf.zeros_like(bv))  # n = 1: it is 0
            y = ChannelsLast(y)
        elif isinstance(x, ChannelsLast):  # N...C: per-channel vectors broadcast as they are
            r = x.t.shape.rank
            bm, bv = tf.nn.moments(x.t, list(range(r - 1)))
            y = ChannelsLast(tf.nn.batch_normalization(x.t, bm, bv, bias, scale, eps))
        else:
            r = x.shape.rank
            bm, bv = tf.nn.moments(x, [0, *range(2, r)])
            y = tf.nn.batch_normalization(x, _per_channel(bm, r), _per_channel(bv, r),
                                          _per_channel(bias, r), _per_channel(scale, r), eps)
        bm, bv = tf.stop_gradient(bm), tf.stop_gradient(bv)
        return y, mean * momentum + bm * (1 - momentum), var * momentum + bv * (1 - momentum)
    x = plain(x)
    r = x.shape.rank
    inv = scale * tf.math.rsqrt(var + tf.cast(eps, var.dtype))
    shift = bias - mean * inv
    return x * tf.cast(_per_channel(inv, r), x.dtype) + tf.cast(_per_channel(shift, r), x.dtype)


@op
def InstanceNormalization(node, x, scale, bias):
    r = x.shape.rank
    mean, var = tf.nn.moments(x, list(range(2, r)), keepdims=True)
    eps = node.attr("epsilon", 1e-5)
    return (x - mean) * tf.math.rsqrt(var + eps) * _per_channel(scale, r) + _per_channel(bias, r)


@op
def LRN(node, x):
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    if isinstance(x, ChannelsLast) and x.t.shape.rank == 4 and size % 2 and x.t.dtype == tf.float32:
        return ChannelsLast(tf.nn.local_response_normalization(
            x.t, depth_radius=(size - 1) // 2, bias=bias, alpha=alpha / size, beta=beta))
    x = plain(x)
    sq = tf.square(x)
    c = x.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = tf.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (x.shape.rank - 2))
    total = tf.add_n([padded[:, i:i + c] for i in range(size)])
    return x / (bias + alpha / size * total) ** beta


@op
def LpNormalization(node, x):
    axis = norm_axis(node.attr("axis", -1), x.shape.rank)
    p = node.attr("p", 2)
    if p == 1:
        norm = tf.reduce_sum(tf.abs(x), axis, keepdims=True)
    else:
        norm = tf.sqrt(tf.reduce_sum(tf.square(x), axis, keepdims=True))
    return tf.math.divide_no_nan(x, norm)





# -- losses ---------------------------------------------------------------------------------------
@op
def NegativeLogLikelihoodLoss(node, x, target, weight=None):
    r = x.shape.rank
    xt = tf.transpose(x, [0, *range(2, r), 1])  # classes last
    ignore = node.attr("ignore_index")
    t = tf.cast(target, tf.int64)
    valid = tf.ones_like(t, tf.bool) if ignore is None else tf.not_equal(t, ignore)
    safe = tf.where(valid, t, tf.zeros_like(t))
    picked = tf.gather(xt, safe, batch_dims=r - 1)
    w = tf.ones_like(picked) if weight is None else tf.gather(weight, safe)
    w = tf.where(valid, w, tf.zeros_like(w))
    loss = -picked * w
    reduction = node.attr("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return tf.reduce_sum(loss)
    return tf.reduce_sum(loss) / tf.reduce_sum(w)


@op
def SoftmaxCrossEntropyLoss(node, x, target, weight=None):
    """Unweighted, without ignore_index, on [N, C]: TensorFlow's fused sparse softmax cross
    entropy (one kernel each way, any batch size while tracing); else log-softmax and NLL."""
    reduction = node.attr("reduction", "mean")
    want_log_prob = len(node.outputs) > 1 and bool(node.outputs[1])
    if (weight is None and node.attr("ignore_index") is None and x.shape.rank == 2
            and x.dtype in (tf.float32, tf.float64) and not want_log_prob):
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(target, tf.int64), x)
        if reduction == "none":
            return loss
        return tf.reduce_sum(loss) if reduction == "sum" else tf.reduce_mean(loss)
    log_prob = tf.nn.log_softmax(x, axis=1)
    loss = NegativeLogLikelihoodLoss(node, log_prob, target, weight)
    return (loss, log_prob) if want_log_prob else loss


@op
def DeformConv(node, x, w, offset, b=None, mask=None):
    """2-D deformable convolution: bilinear samples at offset kernel taps, then a grouped matmul."""
    x = plain(x)
    if x.shape.rank != 4:
        raise node.unsupported("DeformConv other than 2-D")
    n, c, h, wd = x.shape.as_list()
    oc, cg, kh, kw = w.shape.as_list()
    k = kh * kw
    sh, sw = node.attr("strides") or [1, 1]
    dh, dw = node.attr("dilations") or [1, 1]
    pt, pl, pb, pr = node.attr("pads") or [0, 0, 0, 0]
    groups, og = node.attr("group", 1), node.attr("offset_group", 1)
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wd + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    ki, kj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    base_y = (np.arange(oh) * sh - pt)[None, :, None] + (ki.reshape(-1) * dh)[:, None, None]
    base_x = (np.arange(ow) * sw - pl)[None, None, :] + (kj.reshape(-1) * dw)[:, None, None]
    off = tf.reshape(offset, [n, og, k, 2, oh, ow])
    y = tf.constant(base_y, x.dtype) + off[:, :, :, 0]  # [n, og, k, oh, ow]
    xx = tf.constant(base_x, x.dtype) + off[:, :, :, 1]
    inside = (y > -1) & (y < h) & (xx > -1) & (xx < wd)
    y0, x0 = tf.floor(y), tf.floor(xx)
    ly, lx = y - y0, xx - x0
    data = tf.reshape(x, [n, og, c // og, h * wd])
    cols = 0
    for yy, xc, weight in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                           (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
        valid = inside & (yy >= 0) & (yy <= h - 1) & (xc >= 0) & (xc <= wd - 1)
        idx = tf.cast(tf.clip_by_value(yy, 0, h - 1) * wd + tf.clip_by_value(xc, 0, wd - 1),
                      tf.int32)
        vals = tf.gather(data, tf.reshape(idx, [n, og, -1]), axis=3, batch_dims=2)
        vals = tf.reshape(vals, [n, og, c // og, k, oh, ow])
        cols += vals * tf.where(valid, weight, tf.zeros_like(weight))[:, :, tf.newaxis]
    if mask is not None:
        cols *= tf.reshape(mask, [n, og, 1, k, oh, ow])
    cols = tf.reshape(cols, [n, groups, (c // groups) * k, oh * ow])
    wg = tf.reshape(w, [groups, oc // groups, cg * k])
    out = tf.reshape(tf.einsum("ngkp,gok->ngop", cols, wg), [n, oc, oh, ow])
    return out if b is None else out + tf.reshape(b, [1, -1, 1, 1])
