"""The JAX backend: ONNX graph -> one jitted JAX function; one function per ONNX op.

Importing this package imports no JAX: `FRAMEWORK` (framework.py) says what d500 knows about it;
JAX is imported when the backend class (or the op table) is first asked for. Its 64-bit types
are enabled only around the backend's own work (see executable.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from d500.backends.jax.framework import FRAMEWORK

__all__ = ["FRAMEWORK", "OPS", "JaxBackend", "JaxExecutable"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = "ops" if name == "OPS" else "executable"
        return getattr(import_module(f"d500.backends.jax.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
