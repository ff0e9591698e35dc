"""Run any CustomOperator on NumPy arrays: forward, gradients, and its native forward and backward
calls for timing.

torch/tensorflow/jax operators with their own `backward` are wrapped as a torch.autograd.Function /
tf.custom_gradient / jax.custom_vjp (`as_torch_function`, `as_tf_function`, `as_jax_function`), so
the framework calls the backward exactly as it would inside a model. bfloat16 arrays (ml_dtypes)
become torch.bfloat16 tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from d500.operators.base import CustomOperator


def as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class Runner:
    """An operator instance seen through NumPy."""

    def __init__(self, op: CustomOperator):
        self.op = op
        self.own_backward = type(op).has_backward()

    @property
    def has_gradients(self) -> bool:
        return self.own_backward

    def to_native(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        return [np.array(a, copy=True, order="C") for a in arrays]  # the operator may write

    def call(self, native: Sequence[Any]) -> Any:
        """The operator's forward on native inputs (what the benchmark times)."""
        return self.op.forward(*native)

    def forward(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(self._numpy(o)) for o in as_tuple(self.call(self.to_native(arrays)))]

    def gradients(self, arrays: Sequence[np.ndarray], grad_outputs: Sequence[np.ndarray | None]
                  ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        inputs = tuple(self.to_native(arrays))
        outputs = as_tuple(self.op.forward(*inputs))
        grads = as_tuple(self.op.backward(tuple(grad_outputs), inputs, outputs))
        return [np.asarray(o) for o in outputs], _pad(grads, len(arrays))

    def timed_forward(self, arrays: Sequence[np.ndarray]) -> Callable[[], Any]:
        """The call the benchmark times: the forward on inputs converted once."""
        native = self.to_native(arrays)
        return lambda: self.call(native)

    def timed_backward(self, arrays: Sequence[np.ndarray],
                       grad_outputs: Sequence[np.ndarray | None]) -> Callable[[], Any] | None:
        return self.backward_call(arrays, grad_outputs)

    def backward_call(self, arrays: Sequence[np.ndarray],
                      grad_outputs: Sequence[np.ndarray | None]) -> Callable[[], Any] | None:
        """The operator's backward alone (forward done once beforehand), for timing; None when
        it has none."""
        if not self.own_backward:
            return None
        inputs = tuple(self.to_native(arrays))
        outputs = as_tuple(self.op.forward(*inputs))
        grads = tuple(grad_outputs)
        return lambda: self.op.backward(grads, inputs, outputs)

    def _numpy(self, value: Any) -> Any:
        return value


def _pad(grads: Sequence[Any], n: int) -> list[Any]:
    grads = list(grads)[:n]
    return [None if g is None else np.asarray(g) for g in grads] + [None] * (n - len(grads))


class TorchRunner(Runner):
    @property
    def has_gradients(self) -> bool:
        return True  # its own backward, or torch autograd of forward

    def to_native(self, arrays):
        from d500.backends.torch.dtypes import from_numpy
        return [from_numpy(np.array(a, copy=True)) for a in arrays]

    def call(self, native):
        import torch
        with torch.no_grad():
            return self.op.forward(*native)

    def _numpy(self, value):
        from d500.backends.torch.dtypes import to_numpy
        return to_numpy(value)

    def _graph(self, arrays, grad_outputs):
        """Inputs (float ones requiring grad), outputs recorded by autograd, and the pairs of
        differentiable outputs and their output gradients."""
        import torch

        from d500.backends.torch.dtypes import from_numpy
        inputs = self.to_native(arrays)
        for t in inputs:
            if t.is_floating_point():
                t.requires_grad_(True)
        fn = as_torch_function(self.op) if self.own_backward else self.op.forward
        with torch.enable_grad():
            outputs = as_tuple(fn(*inputs))
        pairs = [(o, from_numpy(np.asarray(g)).to(o.dtype))
                 for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
        return inputs, outputs, pairs

    def gradients(self, arrays, grad_outputs):
        import torch
        inputs, outputs, pairs = self._graph(arrays, grad_outputs)
        wrt = [t for t in inputs if t.requires_grad]
        grads = (torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                     allow_unused=True) if pairs and wrt else [None] * len(wrt))
        it = iter(grads)
        out = [next(it) if t.requires_grad else None for t in inputs]
        return ([self._numpy(o) for o in outputs],
                [None if g is None else self._numpy(g) for g in out])

    def backward_call(self, arrays, grad_outputs):
        import torch
        inputs, _, pairs = self._graph(arrays, grad_outputs)
        wrt = [t for t in inputs if t.requires_grad]
        if not pairs or not wrt:
            return None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        return lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)


def as_torch_function(op: CustomOperator) -> Callable[..., Any]:
    """The operator as a torch.autograd.Function whose backward is the operator's backward."""
    import torch

    class OperatorFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            outputs = op.forward(*inputs)
            many = isinstance(outputs, (tuple, list))
            outs = as_tuple(outputs)
            ctx.save_for_backward(*inputs, *outs)
            ctx.n_inputs = len(inputs)
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            return tuple(outs) if many else outs[0]

        @staticmethod
        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            inputs, outputs = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
            from d500.backends.torch.dtypes import from_numpy
            result = _pad_any(as_tuple(op.backward(grads, inputs, outputs)), ctx.n_inputs)
            return tuple(None if g is None else g if isinstance(g, torch.Tensor)
                         else from_numpy(np.asarray(g)) for g in result)

    OperatorFunction.__name__ = f"{type(op).__name__}Function"
    return OperatorFunction.apply


class TensorFlowRunner(Runner):
    @property
    def has_gradients(self) -> bool:
        return True

    def to_native(self, arrays):
        import tensorflow as tf
        return [tf.constant(a) for a in arrays]

    def _numpy(self, value):
        return value.numpy()

    def _tape(self, arrays, grad_outputs, persistent=False):
        import tensorflow as tf
        inputs = self.to_native(arrays)
        fn = as_tf_function(self.op) if self.own_backward else self.op.forward
        tape = tf.GradientTape(persistent=persistent)
        with tape:
            for t in inputs:
                if t.dtype.is_floating:
                    tape.watch(t)
            outputs = as_tuple(fn(*inputs))
        pairs = [(o, tf.constant(np.asarray(g, dtype=o.dtype.as_numpy_dtype)))
                 for o, g in zip(outputs, grad_outputs) if g is not None and o.dtype.is_floating]
        return tape, inputs, outputs, pairs

    def backward_call(self, arrays, grad_outputs):
        tape, inputs, _, pairs = self._tape(arrays, grad_outputs, persistent=True)
        wrt = [t for t in inputs if t.dtype.is_floating]
        if not pairs or not wrt:
            return None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        return lambda: tape.gradient(outs, wrt, output_gradients=grads)

    def gradients(self, arrays, grad_outputs):
        import tensorflow as tf
        tape, inputs, outputs, pairs = self._tape(arrays, grad_outputs)
        wrt = [t for t in inputs if t.dtype.is_floating]
        grads = (tape.gradient([o for o, _ in pairs], wrt,
                               output_gradients=[g for _, g in pairs])
                 if pairs else [None] * len(wrt))
        it = iter(grads)
        out = [next(it) if t.dtype.is_floating else None for t in inputs]
        return ([self._numpy(o) for o in outputs],
                [None if g is None else np.asarray(tf.convert_to_tensor(g)) for g in out])


def as_tf_function(op: CustomOperator) -> Callable[..., Any]:
    """The operator wrapped with tf.custom_gradient so its backward is the operator's backward."""
    import tensorflow as tf

    @tf.custom_gradient
    def operator_function(*inputs):
        outputs = op.forward(*inputs)
        outs = as_tuple(outputs)

        def grad(*upstream):
            result = _pad_any(as_tuple(op.backward(upstream, inputs, outs)), len(inputs))
            return result

        return outputs, grad

    return operator_function


def _pad_any(grads: Sequence[Any], n: int) -> list[Any]:
    grads = list(grads)[:n]
    return grads + [None] * (n - len(grads))


class JaxRunner(Runner):
    """A JAX operator as it runs in a model: its forward jitted (jax.jit; inputs are arguments,
    never constants XLA could fold), its gradient jax.vjp through the operator's backward
    (jax.custom_vjp) or JAX's autograd of the forward. Every call computes with JAX's 64-bit
    types on (float64 cases stay float64) and waits for its results (JAX dispatches
    asynchronously: an unwaited call would time only the dispatch)."""

    def __init__(self, op: CustomOperator):
        super().__init__(op)
        import jax
        self.fn = as_jax_function(op) if self.own_backward else _tupled(op.forward)
        self._forward = jax.jit(self.fn)
        self._gradients = jax.jit(self._vjp, static_argnums=0)
        self._apply = jax.jit(lambda pull, cotangents: pull(cotangents))

    @property
    def has_gradients(self) -> bool:
        return True

    def to_native(self, arrays):
        import jax
        with _x64():
            return [jax.device_put(np.array(a, copy=True)) for a in arrays]

    def call(self, native):
        import jax
        with _x64():
            return jax.block_until_ready(self._forward(*native))

    def _numpy(self, value):
        return np.asarray(value)

    def _split(self, arrays):
        """(which inputs are float, the float inputs, the others) of NumPy inputs."""
        import jax.numpy as jnp
        native = self.to_native(arrays)
        mask = tuple(bool(jnp.issubdtype(x.dtype, jnp.inexact)) for x in native)
        return (mask, [x for x, f in zip(native, mask) if f],
                [x for x, f in zip(native, mask) if not f])

    def _of_floats(self, mask, others, *floats):
        it, rest = iter(floats), iter(others)
        return self.fn(*[next(it) if f else next(rest) for f in mask])

    def _vjp(self, mask, floats, others, grad_outputs):
        import jax
        outputs, pull = jax.vjp(lambda *xs: self._of_floats(mask, others, *xs), *floats)
        return outputs, pull(_cotangents(outputs, grad_outputs))

    def gradients(self, arrays, grad_outputs):
        mask, floats, others = self._split(arrays)
        with _x64():
            outputs, grads = self._gradients(mask, floats, others, list(grad_outputs))
        it = iter(grads)
        return ([self._numpy(o) for o in outputs],
                [self._numpy(next(it)) if f else None for f in mask])

    def backward_call(self, arrays, grad_outputs):
        """The pullback alone, from the residuals of one forward (jax.vjp, done here once)."""
        import jax
        mask, floats, others = self._split(arrays)
        if not floats or all(g is None for g in grad_outputs):
            return None
        with _x64():
            outputs, pull = jax.vjp(lambda *xs: self._of_floats(mask, others, *xs), *floats)
            cotangents = _cotangents(outputs, list(grad_outputs))

        def call():
            with _x64():
                return jax.block_until_ready(self._apply(pull, cotangents))
        return call


def _x64():
    """The context every JAX operator call runs in (as d500's JAX backend computes)."""
    from d500.backends.jax.executable import x64
    return x64()


def _tupled(fn: Callable[..., Any]) -> Callable[..., tuple]:
    return lambda *inputs: as_tuple(fn(*inputs))


def _cotangents(outputs: Sequence[Any], grad_outputs: Sequence[Any]) -> tuple:
    """One cotangent per output: the given output gradient, zeros where none is given, float0
    zeros for an integer output (JAX's cotangent type of a non-differentiable value)."""
    import jax
    import jax.numpy as jnp
    found = []
    for o, g in zip(outputs, list(grad_outputs) + [None] * len(outputs)):
        if not jnp.issubdtype(o.dtype, jnp.inexact):
            found.append(np.zeros(o.shape, dtype=jax.dtypes.float0))
        else:
            found.append(jnp.zeros_like(o) if g is None else jnp.asarray(g, dtype=o.dtype))
    return tuple(found)


def as_jax_function(op: CustomOperator) -> Callable[..., tuple]:
    """The operator as a jax.custom_vjp function (outputs as a tuple) whose backward is the
    operator's backward, given its inputs and outputs as residuals; integer inputs get no
    gradient."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def operator_function(*inputs):
        return as_tuple(op.forward(*inputs))

    def forward(*inputs):
        outputs = operator_function(*inputs)
        return outputs, (inputs, outputs)

    def backward(saved, grads):
        inputs, outputs = saved
        result = _pad_any(as_tuple(op.backward(tuple(grads), inputs, outputs)), len(inputs))
        return tuple(None if g is None or not jnp.issubdtype(x.dtype, jnp.inexact)
                     else jnp.asarray(g, dtype=x.dtype) for x, g in zip(inputs, result))

    operator_function.defvjp(forward, backward)
    return operator_function


def runner(op: CustomOperator) -> Runner:
    """The Runner for an operator instance's framework (an operator in a host process,
    d500.operators.host, brings its own)."""
    if hasattr(op, "runner"):
        return op.runner()
    return {"torch": TorchRunner, "tensorflow": TensorFlowRunner,
            "jax": JaxRunner}.get(op.framework, Runner)(op)
