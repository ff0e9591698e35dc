"""An operator host's heap is set as the judge's (d500.heap.allocator): left to glibc, a young
host mmapped its temporaries anew each call and its im2col Conv 1x1 took 3x the judge's time.
The settings are read back by what glibc does (d500.heap.probe), in the host and in a fresh judge:
a long-lived process (a test worker) may serve a probe's block from a large free chunk it holds,
whatever its thresholds, so the judge's side is probed where its heap is young, as a host's is."""

from __future__ import annotations

import subprocess
import sys

from d500.operators.host import RemoteClass

RELU = '''
import numpy as np
from d500.operators import CustomOperator


class Relu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.maximum(x, 0)
'''


def test_host_heap_is_the_judges(tmp_path):
    def fresh(code):
        script = f"from d500 import heap; {code}print(heap.probe())"
        out = subprocess.run([sys.executable, "-c", script],
                             capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()

    assert fresh("") == "(True, True)"  # glibc's own: the probe tells them apart
    judge = fresh("heap.allocator(); ")
    assert judge == "(False, True)"
    file = tmp_path / "relu.py"
    file.write_text(RELU)
    cls = RemoteClass.start(file, "Relu")
    try:
        assert str(tuple(cls.host.ask("heap"))) == judge
    finally:
        cls.close()
