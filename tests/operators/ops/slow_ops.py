"""A NumPy Relu that sleeps 2 ms a call: its latency depends little on the machine's load
(tests/competition/test_reproduce_latency.py; tests/operators/test_call_count.py,
test_isolation.py)."""

import time

import numpy as np

from d500.operators import CustomOperator


class SlowRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        time.sleep(0.002)
        return np.maximum(x, 0)

    def backward(self, grad_outputs, inputs, outputs):
        return [grad_outputs[0] * (inputs[0] > 0)]
