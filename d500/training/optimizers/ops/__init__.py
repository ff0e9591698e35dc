"""The per-framework "ops" namespaces the framework-neutral optimizers are written against: the
same two dozen small multi-tensor functions in each framework's folder, `optimizer_ops.py`
(d500/backends/reference/ for NumPy, torch/, tensorflow/, jax/: the module its FRAMEWORK names;
JAX's arrays are immutable: its in-place ops replace the list entries).

Every function works on *tensor lists* (one entry per parameter, the same order everywhere), so
torch runs each as one `torch._foreach_*` kernel call and TensorFlow traces it once into the
caller's tf.function. Arguments: `xs, ys, zs` are tensor lists; `s`, `alpha`, `value`, `w` are
scalars: a Python number, a framework 0-d tensor (the learning rate inside a tf.function), or,
where noted, a list with one scalar per entry. Functional ops return a new list.

    creation (at init, outside any trace)
      zeros_like(xs), full_like(xs, value)  new state tensors (tf.Variables on TensorFlow)
      vector(values, like)                   a constant 1-D tensor of Python floats
      counter(), increment(c) -> t            a step counter; t = the count after the increment
    functional
      add(xs, ys, alpha=1)  x + alpha*y (ys a list or a scalar)
      mul(xs, s)  x*s (s may be a list)
      div(xs, ys)  sqrt(xs)  sign(xs)  maximum(xs, ys)
      norm(xs) -> list of 0-d   stack(scalars) -> 1-D   unstack(v) -> list of 0-d   where(c, a, b)
      bias_correction(beta, t)   1 - beta**t, computed in float64 (a Python float or float32 tensor)
    in place (on the tensors themselves: torch, NumPy, tf.Variable; on a TensorFlow intermediate,
    whose tensors are immutable, the list entry is replaced)
      assign_(xs, ys)  add_(xs, ys, alpha=1)  mul_(xs, s)  lerp_(xs, ys, w)  x += w*(y - x)
      addcmul_(xs, ys, zs, value=1)  x += value*y*z
      addcdiv_(xs, ys, zs, value=1)  x += value*y/z
    no_grad()   the context an update runs in (torch.no_grad on torch)

Vectors from `stack`/`vector` and the scalars `norm` returns take Python operators (+ - * / > &)
on every framework.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import Any

from d500.errors import UsageError


def get(ns: str | ModuleType | Any) -> ModuleType:
    """The ops namespace of a framework (by backend name, module or other name: 'reference',
    'numpy', 'torch', 'tensorflow', 'jax'): the `optimizer_ops` module its FRAMEWORK names; an
    ops module (or any object with the same functions) is returned as is."""
    if not isinstance(ns, str):
        return ns
    from d500.backends import by_module, frameworks
    fw = by_module(ns)
    if fw is None or fw.optimizer_ops is None:
        known = [f.name for f in frameworks() if f.optimizer_ops is not None]
        raise UsageError(f"no framework-neutral optimizers for '{ns}' (known: {', '.join(known)})")
    try:
        return import_module(fw.optimizer_ops)
    except ImportError as err:
        raise UsageError(f"framework for '{ns}' is not installed here ({err.name or err})") from err
