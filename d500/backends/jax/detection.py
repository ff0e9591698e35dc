"""Detection JAX ops: RoiAlign (on regions known while tracing: they decide the sampling grids),
DeformConv (traced, through grid sampling); NonMaxSuppression is a shared host op."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from d500.backends import deform, host_ops
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, static
from d500.backends.jax.image import grid_sample

OPS, op = registry()


def _host(x, what: str) -> np.ndarray:
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return value


@op
def RoiAlign(node, x, rois, batch_indices):
    """Average or max of bilinear samples per bin, at the shared sampling grid of each region."""
    n, c, h, w = x.shape
    pooled, samples = host_ops.roi_align(node, (h, w))
    data = x.reshape(n, c, h * w)
    outs = []
    for roi, b in zip(_host(rois, "rois").tolist(),
                      _host(batch_indices, "batch indices").reshape(-1).tolist()):
        pos, weights, count = samples(roi)
        if count == 0:
            outs.append(jnp.zeros((c, *pooled), x.dtype))
            continue
        vals = data[int(b)][:, pos.reshape(-1)].reshape(c, *pos.shape)
        vals = vals * jnp.asarray(weights, x.dtype)
        if node.attr("mode", "avg") == "avg":
            outs.append(vals.sum(axis=(3, 4, 5)) / count)
        else:
            outs.append(vals.max(axis=-1).max(axis=(3, 4)))
    return jnp.stack(outs) if outs else jnp.zeros((0, c, *pooled), x.dtype)


_DEFORM = deform.Kit(asarray=lambda a, like: a, stack=jnp.stack,
                     sample=lambda feature, grid: grid_sample(feature, grid, "linear", "zeros", 1),
                     matmul=functools.partial(jnp.matmul, precision="highest"))


@op
def DeformConv(node, x, w, offset, b=None, mask=None):
    return deform.deform_conv(_DEFORM, node, x, w, offset, b, mask)
