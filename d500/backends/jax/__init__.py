"""The JAX backend: ONNX graph -> one jitted JAX function; one function per ONNX op.

Importing this package imports JAX. Its 64-bit types are enabled only around the backend's own
work (see executable.py).
"""

from __future__ import annotations

from d500.backends.jax.executable import JaxBackend, JaxExecutable
from d500.backends.jax.ops import OPS

__all__ = ["OPS", "JaxBackend", "JaxExecutable"]
