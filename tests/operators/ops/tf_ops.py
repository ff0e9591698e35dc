"""TensorFlow operators: Sigmoid with its own backward (wrapped by d500 in tf.custom_gradient),
MatMul through TensorFlow autograd, and a Sigmoid whose backward is wrong in 4% of elements."""

from __future__ import annotations

import tensorflow as tf

from d500.operators import CustomOperator


class TfSigmoid(CustomOperator):
    op_type = "Sigmoid"
    framework = "tensorflow"

    def forward(self, x):
        return tf.math.sigmoid(x)

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (y,) = grad_outputs, outputs
        return (g * y * (1 - y),)


class TfMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "tensorflow"

    def forward(self, a, b):
        return tf.linalg.matmul(a, b)


class WrongTfSigmoid(TfSigmoid):
    def backward(self, grad_outputs, inputs, outputs):
        (dx,) = super().backward(grad_outputs, inputs, outputs)
        flat = tf.reshape(dx, [-1])
        mask = tf.cast(tf.range(tf.size(flat)) % 25 == 0, flat.dtype)
        return (tf.reshape(flat * (1 + 0.1 * mask), tf.shape(dx)),)
