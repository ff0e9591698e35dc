"""The TensorFlow backend: ONNX graph -> tf.function over a tf.Module; one function per ONNX op.

Importing this package imports no TensorFlow: `FRAMEWORK` (framework.py) says what d500 knows
about it. Asking for the backend class (or the op table) imports TensorFlow, with its C++
start-up chatter silenced.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from d500.backends import quiet_frameworks
from d500.backends.tensorflow.framework import FRAMEWORK

quiet_frameworks()  # TensorFlow's C++ log level, for whichever module here imports it first

__all__ = ["FRAMEWORK", "OPS", "OnnxModule", "TensorFlowBackend", "TensorFlowExecutable"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from d500.backends.tensorflow.framework import import_tensorflow
        import_tensorflow().get_logger().setLevel("ERROR")  # no retracing chatter
        module = "ops" if name == "OPS" else "executable"
        return getattr(import_module(f"d500.backends.tensorflow.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
