"""Control flow, sequences and optionals in JAX: If and SplitToSequence here, Loop, Scan,
Sequence* and Optional* from the shared `control_flow` module over JAX's primitives.

Sequences are Python lists of arrays; an empty optional is None. Loops and scans unroll while
tracing, so their trip counts (and a Loop's condition) must be known then; an If on a traced
condition computes both branches and selects, when their outputs agree in shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from d500.backends import control_flow
from d500.backends.control_flow import one
from d500.backends.graph import registry
from d500.backends.jax.core import NotStatic, ints, norm_axis, static

OPS, op = registry()


def _flag(x, what: str) -> bool:
    value = static(x)
    if value is None:
        raise NotStatic(what, x)
    return bool(value.reshape(-1)[0])


KIT = control_flow.Kit(
    flag=_flag, count=lambda x, what: ints(x, what)[0],
    scalar=lambda node, value: jnp.asarray(value),
    is_array=lambda x: not isinstance(x, list),
    empty=lambda node: jnp.zeros((0,), jnp.float32),
    stack=jnp.stack, concat=jnp.concatenate, moveaxis=jnp.moveaxis,
    flip=lambda x: jnp.flip(x, 0), axis=norm_axis)
OPS.update(control_flow.table(KIT))


@op
def If(node, cond):
    value = static(cond)
    if value is not None:
        branch = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
        return one(node.run_subgraph(branch))
    then, other = node.run_subgraph("then_branch"), node.run_subgraph("else_branch")
    flat_then, tree = jax.tree_util.tree_flatten(then)
    flat_other, tree_other = jax.tree_util.tree_flatten(other)
    if tree != tree_other or any(
            getattr(a, "shape", None) != getattr(b, "shape", None) for a, b in zip(
                flat_then, flat_other)):
        raise NotStatic("condition (its branches' outputs differ in shape)")
    c = jnp.asarray(cond).reshape(-1)[0]
    picked = [jnp.where(c, a, b) for a, b in zip(flat_then, flat_other)]
    return one(jax.tree_util.tree_unflatten(tree, picked))


@op
def SplitToSequence(node, x, split=None):
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    if split is None:
        parts = jnp.split(x, x.shape[axis], axis)
        return list(parts) if node.attr("keepdims", 1) else [p.squeeze(axis) for p in parts]
    sizes = ints(split, "split")
    if split.ndim == 0:
        sizes = [sizes[0]] * (x.shape[axis] // sizes[0]) + (
            [x.shape[axis] % sizes[0]] if x.shape[axis] % sizes[0] else [])
    return list(jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis))
