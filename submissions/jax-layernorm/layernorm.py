"""ONNX LayerNormalization (opset 17: normalise over the axes from `axis` on, then scale and an
optional bias) in JAX with a hand-written backward, which d500 wraps as a jax.custom_vjp rule."""

from __future__ import annotations

import jax.numpy as jnp

from d500.operators import CustomOperator


class JaxLayerNorm(CustomOperator):
    op_type = "LayerNormalization"
    framework = "jax"

    def __init__(self, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1):
        super().__init__(axis=axis, epsilon=epsilon, stash_type=stash_type)
        self.axis, self.epsilon = int(axis), float(epsilon)

    def _normalised(self, x):
        """(x - mean) / std over the normalised axes, and 1 / std."""
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        centred = x - x.mean(axis=axes, keepdims=True)
        rstd = 1 / jnp.sqrt((centred * centred).mean(axis=axes, keepdims=True) + self.epsilon)
        return centred * rstd, rstd, axes

    def forward(self, x, scale, bias=None):
        xhat, _, _ = self._normalised(x)
        y = xhat * scale
        return y if bias is None else y + bias

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (x, scale, *bias) = grad_outputs, inputs
        xhat, rstd, axes = self._normalised(x)
        lead = tuple(range(x.ndim - scale.ndim))  # the axes scale and bias broadcast over
        dxhat = g * scale
        dx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                     - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
        grads = (dx, (g * xhat).sum(axis=lead))
        return grads + ((g.sum(axis=lead),) if bias else ())
