"""The backward pass alone, as a call to time: a backend's own gradient of one operator case, given
its forward's saved state, the way each framework runs it inside a model.

- torch: `torch.autograd.grad` on the outputs of the translated module (`Executable.native`),
  the graph recorded once and retained;
- tensorflow: a persistent `tf.GradientTape` around one call of the translated module, then its
  `gradient` per call;
- jax, jax:eager: the pullback of `jax.vjp` over the translated graph (`Executable.pure`), its
  residuals saved by one forward, applied per call (jitted in the mode jax, as the backend jits);
- reference: the NumPy VJP of the node (`d500.backends.reference`'s table) on the forward's
  values; an operator the table differentiates through its ONNX function expansion
  (LayerNormalization) is timed as `Executable.gradients` (forward and backward), and the
  benchmark subtracts the forward's median;
- onnxruntime: inference only, no backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from d500.operators.dtypes import is_float

FORWARD_AND_BACKWARD = "forward+backward"  # a call that also runs the forward


@dataclass
class BackwardCall:
    """A call that runs one backward pass, and what it includes."""

    call: Callable[[], Any]
    includes: str = "backward"  # or FORWARD_AND_BACKWARD
    method: str = ""            # how the backend runs it, for the record


def builtin_backward(name: str, exe: Any, case: Any, inputs: Sequence[np.ndarray],
                     grad_outputs: Sequence[np.ndarray | None]) -> BackwardCall | None:
    """A backend's own backward for the one-node model `exe` runs; None when the backend has
    none (onnxruntime, an operator without a gradient). Raises what the backend raises."""
    seeds = {exe.output_names[k]: g for k, g in enumerate(grad_outputs)
             if g is not None and k < len(exe.output_names)}
    wrt = [n for n, x in zip(exe.input_names, inputs) if is_float(np.asarray(x).dtype)]
    if not seeds or not wrt:
        return None
    if name == "torch":
        return _torch(exe, inputs, seeds, wrt)
    if name == "tensorflow":
        return _tensorflow(exe, inputs, seeds, wrt)
    if name.partition(":")[0] == "jax":
        return _jax(exe, inputs, seeds, wrt)
    if name == "reference":
        return _reference(exe, case, inputs, seeds, wrt)
    return None


def _torch(exe: Any, inputs: Sequence[np.ndarray], seeds: dict[str, np.ndarray],
           wrt: list[str]) -> BackwardCall:
    import torch

    from d500.backends.torch.dtypes import from_numpy
    feeds = {}
    for n, x in zip(exe.input_names, inputs):
        t = from_numpy(np.array(x, copy=True))
        feeds[n] = t.requires_grad_(True) if n in wrt else t
    with torch.enable_grad():
        outs = exe.native(**feeds)
    by_name = dict(zip(exe.output_names, outs))
    ys = [by_name[n] for n in seeds]
    gs = [from_numpy(np.asarray(g)).to(by_name[n].dtype) for n, g in seeds.items()]
    xs = [feeds[n] for n in wrt]
    return BackwardCall(lambda: torch.autograd.grad(ys, xs, gs, retain_graph=True,
                                                    allow_unused=True),
                        method="torch.autograd.grad on the translated module, graph retained")


def _tensorflow(exe: Any, inputs: Sequence[np.ndarray], seeds: dict[str, np.ndarray],
                wrt: list[str]) -> BackwardCall:
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


def _jax(exe: Any, inputs: Sequence[np.ndarray], seeds: dict[str, np.ndarray],
         wrt: list[str]) -> BackwardCall:
    import jax
    import jax.numpy as jnp

    from d500.backends.jax.executable import x64
    f, params = exe.pure()
    fixed = {n: x for n, x in zip(exe.input_names, inputs) if n not in wrt}
    index = [exe.output_names.index(n) for n in seeds]

    def seeded(*xs):
        outs = f(params, {**fixed, **dict(zip(wrt, xs))})
        return [outs[k] for k in index]

    with x64():
        feeds = dict(zip(exe.input_names, inputs))
        outs, pull = jax.vjp(seeded, *[jnp.asarray(feeds[n]) for n in wrt])
        gs = [jnp.asarray(g, dtype=o.dtype) for o, g in zip(outs, seeds.values())]
    apply = exe.compile(lambda pull, gs: pull(gs))

    def call():
        with x64():
            return jax.block_until_ready(apply(pull, gs))
    how = "jitted" if exe.jit else "op by op"
    return BackwardCall(call, method=f"jax.vjp's pullback on the translated graph ({how}), "
                                     f"residuals saved once")


def _reference(exe: Any, case: Any, inputs: Sequence[np.ndarray], seeds: dict[str, np.ndarray],
               wrt: list[str]) -> BackwardCall:
    from d500.backends.reference.executable import VJP
    from d500.backends.reference.table import Step, attributes
    from d500.operators.reference import DEFAULT_OPSET
    node = exe.model.graph.node[0]
    vjp = VJP.get(node.op_type)
    feeds = list(inputs)
    if vjp is None:
        return BackwardCall(lambda: exe.gradients(feeds, grad_outputs=seeds, wrt=wrt),
                            FORWARD_AND_BACKWARD,
                            f"Executable.gradients (the reference differentiates {node.op_type} "
                            f"through its function expansion) minus the forward")
    outputs = exe.run(feeds)
    step = Step(node, case.opset or DEFAULT_OPSET, feeds, outputs, attributes(node))
    g = [seeds.get(n) for n in exe.output_names]
    return BackwardCall(lambda: vjp(step, g), method="the NumPy VJP of the node")
