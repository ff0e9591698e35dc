"""What level 0's call check costs an honest operator (d500.operators.host: every timed forward
call on its own shifted input, each call's outputs returned as a checksum; every timed backward
call on its own shifted output gradient, its input gradients returned as checksums): the same
operator in the same host timed through the checked round trips and through the unchecked loop
d500 used before, interleaved round trip by round trip, the forward and the backward each.

Per case it prints the median per-call wall time of each (the judge's clock: round trip / calls)
and their ratio, and the host's CPU time per call of each (/proc, load-robust) and its ratio.
Cases: Relu on relu-4d's 8x32x32x32 float32 (memory-bound, the worst case: the shift and the
checksum are each a pass over the data, as the Relu is) in NumPy, torch and JAX, and a 256x256
float32 MatMul (compute-bound) in NumPy and torch. The shift and the checksum run in each
operator's framework (d500.operators.adapters.Runner.shifted and .checksums).

    .venv/bin/python benchmarks/call_check.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from d500 import children
from d500.operators.host import Batched, RemoteClass

OPERATORS = '''
import numpy as np
import torch
from d500.operators import CustomOperator


class NumpyRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.maximum(x, 0)

    def backward(self, grad_outputs, inputs, outputs):
        return [grad_outputs[0] * (inputs[0] > 0)]


class TorchRelu(CustomOperator):
    op_type = "Relu"
    framework = "torch"

    def forward(self, x):
        return torch.relu(x)


class JaxRelu(CustomOperator):
    op_type = "Relu"
    framework = "jax"

    def forward(self, x):
        import jax.numpy as jnp
        return jnp.maximum(x, 0)


class NumpyMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"

    def forward(self, a, b):
        return a @ b

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (a, b) = grad_outputs, inputs
        return [g @ b.T, a.T @ g]


class TorchMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "torch"

    def forward(self, a, b):
        return a @ b
'''


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def case(file: Path, name: str, inputs: list[np.ndarray], rounds: int) -> None:
    cls = RemoteClass.start(file, name)
    try:
        run = cls().runner()
        checked = run.timed_forward(inputs)
        unchecked = Batched(cls.host, "forward")  # no inputs: the unchecked loop
        compare(cls, name, "forward", checked, unchecked, rounds,
                (lambda a: [np.maximum(a[0], 0)]) if name.endswith("Relu")
                else (lambda a: [a[0] @ a[1]]), (1e-4, 1e-5))
        out = inputs[0] if name.endswith("Relu") else inputs[0] @ inputs[1]
        grads = [np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)]
        checked = run.timed_backward(inputs, grads)
        cls.host.ask("prepare", "backward", inputs, grads)  # no key: the unchecked loop
        unchecked = Batched(cls.host, "backward")
        compare(cls, name, "backward", checked, unchecked, rounds,
                (lambda a, g: [g[0] * (a[0] > 0)]) if name.endswith("Relu")
                else (lambda a, g: [g[0] @ a[1].T, a[0].T @ g[0]]), (1e-3, 1e-5))
    finally:
        cls.close()


def compare(cls: RemoteClass, name: str, kind: str, checked: Batched, unchecked: Batched,
            rounds: int, reference: object, tolerance: tuple[float, float]) -> None:
    """Time `checked` and `unchecked` interleaved, print the figures, verify `checked`."""
    pid = children.kept(cls.host.process.pid)  # the process that runs the operator
    wall: dict[str, list[float]] = {"checked": [], "unchecked": []}
    cpu = dict.fromkeys(wall, 0.0)
    calls = dict.fromkeys(wall, 0)
    for r in range(rounds):
        order = [("checked", checked), ("unchecked", unchecked)][:: 1 if r % 2 else -1]
        for label, fn in order:
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            fn()
            wall[label].append((time.perf_counter() - t0) / fn.inner)
            cpu[label] += cpu_seconds(pid) - c0
            calls[label] += fn.inner
    med = {k: statistics.median(v) for k, v in wall.items()}
    per_cpu = {k: cpu[k] / calls[k] for k in cpu}
    print(f"{name:12} {kind:8} wall per call: checked {med['checked'] * 1e3:.4f} ms, "
          f"unchecked {med['unchecked'] * 1e3:.4f} ms, "
          f"ratio {med['checked'] / med['unchecked']:.2f};"
          f" host CPU per call: {per_cpu['checked'] * 1e3:.4f} / "
          f"{per_cpu['unchecked'] * 1e3:.4f} ms, ratio "
          f"{per_cpu['checked'] / max(per_cpu['unchecked'], 1e-12):.2f}; empty round trip "
          f"{checked.overhead * 1e3:.2f} ms, {checked.inner} calls a round trip")
    problem = checked.verify(reference, *tolerance)
    print(f"{'':21} honest calls verified: {problem or 'all sampled calls agree'} "
          f"(pairs of calls told apart: {checked.power:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    from d500 import threads
    threads.configure(modules=["numpy", "torch", "jax"])  # as `d500 op bench`: usable cores
    print("load:", os.getloadavg(), "threads:", threads.recorded())
    rng = np.random.default_rng(0)
    relu = [rng.standard_normal((8, 32, 32, 32)).astype(np.float32)]
    mm = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "ops.py"
        file.write_text(OPERATORS)
        for name, inputs in [("NumpyRelu", relu), ("TorchRelu", relu), ("JaxRelu", relu),
                             ("NumpyMatMul", mm), ("TorchMatMul", mm)]:
            case(file, name, inputs, args.rounds)
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
