"""JAX operators: Sigmoid with its own backward (wrapped by d500 in jax.custom_vjp), MatMul through
JAX's autograd, a Sigmoid whose backward is wrong in 4% of elements, and a MatMul that returns
before it has computed anything unless d500 waits for it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d500.operators import CustomOperator


class JaxSigmoid(CustomOperator):
    op_type = "Sigmoid"
    framework = "jax"

    def forward(self, x):
        return jax.nn.sigmoid(x)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        return (g * y * (1 - y),)


class JaxMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "jax"

    def forward(self, a, b):
        return jnp.matmul(a, b)


class WrongJaxSigmoid(JaxSigmoid):
    def backward(self, grad_outputs, inputs, outputs):
        (dx,) = super().backward(grad_outputs, inputs, outputs)
        flat = dx.reshape(-1)
        mask = (jnp.arange(flat.size) % 25 == 0).astype(flat.dtype)
        return ((flat * (1 + 0.1 * mask)).reshape(dx.shape),)


class SlowJaxMatMul(CustomOperator):
    """The product, then 40 more products of a 256x256 matrix that change nothing: milliseconds
    of work that JAX runs after the call has returned (asynchronous dispatch)."""

    op_type = "MatMul"
    framework = "jax"

    def forward(self, a, b):
        x = jnp.ones((256, 256), a.dtype) / 256
        for _ in range(40):
            x = jnp.tanh(x @ x)
        return jnp.matmul(a, b) + 0 * x[0, 0]
