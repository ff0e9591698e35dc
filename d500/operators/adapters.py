"""Run any CustomOperator on NumPy arrays: forward, gradients, and its native forward and backward
calls for timing.

torch/tensorflow operators with their own `backward` are wrapped as a torch.autograd.Function /
tf.custom_gradient (`as_torch_function`, `as_tf_function`), so the framework calls the backward
exactly as it would inside a model. bfloat16 arrays (ml_dtypes) become torch.bfloat16 tensors.
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


def runner(op: CustomOperator) -> Runner:
    """The Runner for an operator instance's framework (an operator in a host process,
    d500.operators.host, brings its own)."""
    if hasattr(op, "runner"):
        return op.runner()
    return {"torch": TorchRunner, "tensorflow": TensorFlowRunner}.get(op.framework, Runner)(op)
