"""The TensorFlow backend: ONNX graph -> tf.function over a tf.Module; one function per ONNX op.

Importing this package imports TensorFlow, with its C++ start-up chatter silenced.
"""

from __future__ import annotations

from d500.backends import import_quietly

import_quietly("tensorflow").get_logger().setLevel("ERROR")  # no retracing chatter either

from d500.backends.tensorflow.executable import (  # noqa: E402 - after the TF set-up
    OnnxModule,
    TensorFlowBackend,
    TensorFlowExecutable,
)
from d500.backends.tensorflow.ops import OPS  # noqa: E402

__all__ = ["OPS", "OnnxModule", "TensorFlowBackend", "TensorFlowExecutable"]
