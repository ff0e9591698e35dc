"""TensorFlow's part of level 0: how a TensorFlow operator runs (TensorFlowRunner: gradients by
a GradientTape, through the operator's own backward as a tf.custom_gradient), and how
TensorFlow's own backward of one operator case is timed (`backward`). Its FRAMEWORK names both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from d500.operators.adapters import Runner, as_tuple, pad_any
from d500.operators.backward import BackwardCall
from d500.operators.base import CustomOperator


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

    def shifted_backward(self, arrays, grad_outputs):
        """The output gradient converted anew each call, the offsets added by NumPy (a
        tf.constant cannot be rewritten), then the persistent tape's gradient."""
        import tensorflow as tf

        from d500.operators.adapters import Buffers, add_tiled, first_grad, float_grads, signed
        if first_grad(grad_outputs) is None:
            return None
        tape, inputs, _, pairs = self._tape(arrays, grad_outputs, persistent=True)
        wrt = [t for t in inputs if t.dtype.is_floating]
        if not pairs or not wrt:
            return None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        first = np.ascontiguousarray(grads[0].numpy()).reshape(-1)  # first_grad's pair
        shape, buffers = grads[0].shape, Buffers()

        def backward(offsets, signs=None):
            grads[0] = tf.constant(add_tiled(first, signed(offsets, signs, buffers),
                                             np.empty_like(first)).reshape(shape))
            return float_grads(tape.gradient(outs, wrt, output_gradients=grads), arrays)
        return backward

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
            result = pad_any(as_tuple(op.backward(upstream, inputs, outs)), len(inputs))
            return result

        return outputs, grad

    return operator_function


def backward(mode: str, exe: Any, case: Any, inputs: Sequence[np.ndarray],
             seeds: dict[str, np.ndarray], wrt: list[str]) -> BackwardCall | None:
    """A persistent tf.GradientTape around one call of the translated module, then its
    `gradient` per call; None in another mode than the graph (as before the hooks, only the
    graph mode's backward is timed here)."""
    if mode:
        return None
    import tensorflow as tf
    xs = {n: tf.constant(x) for n, x in zip(exe.input_names, inputs)}
    tape = tf.GradientTape(persistent=True)
    with tape:
        for n in wrt:
            tape.watch(xs[n])
        outs = exe.native([xs[n] for n in exe.input_names])
    by_name = dict(zip(exe.output_names, outs))
    ys = [by_name[n] for n in seeds]
    gs = [tf.constant(np.asarray(g, dtype=by_name[n].dtype.as_numpy_dtype))
          for n, g in seeds.items()]
    sources = [xs[n] for n in wrt]
    return BackwardCall(lambda: tape.gradient(ys, sources, output_gradients=gs),
                        method="a persistent tf.GradientTape's gradient")
