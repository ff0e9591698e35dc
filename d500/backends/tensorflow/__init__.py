"""The TensorFlow backend: ONNX graph -> tf.function over a tf.Module; one function per ONNX op.

Importing this package imports TensorFlow, with its C++ start-up chatter silenced.
"""

from __future__ import annotations

import os
import sys


def _import_tensorflow() -> None:
    """Import TensorFlow once, quietly: TF_CPP_MIN_LOG_LEVEL does not cover the messages
    TensorFlow's C++ side writes to stderr before its logging is set up, so stderr (fd 2) is
    pointed at /dev/null for the duration of the import."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        import tensorflow as tf
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    tf.get_logger().setLevel("ERROR")  # no retracing chatter: each node test traces its own graph


_import_tensorflow()

from d500.backends.tensorflow.executable import (  # noqa: E402 - after the TF set-up
    OnnxModule,
    TensorFlowBackend,
    TensorFlowExecutable,
)
from d500.backends.tensorflow.ops import OPS  # noqa: E402

__all__ = ["OPS", "OnnxModule", "TensorFlowBackend", "TensorFlowExecutable"]
