"""What d500 knows about torch without importing it: its packages, threads and hooks."""

from __future__ import annotations

import sys
from typing import Any

from d500.backends.hooks import Framework


class Torch(Framework):
    """torch's intra-op pool, set and read through torch's API."""

    def set_threads(self, n: int) -> None:
        import torch
        torch.set_num_threads(n)

    def default_threads(self, cpu: dict[str, Any]) -> tuple[int, str] | None:
        cores = cpu.get("physical_cores")
        return (int(cores), "its physical cores") if cores else None

    def threads(self) -> Any:
        return sys.modules["torch"].get_num_threads()


FRAMEWORK = Torch(
    "torch", module="torch", distribution="torch",
    optimizer_ops="d500.backends.torch.optimizer_ops",
    native_optimizers="d500.backends.torch.native_optimizers:NATIVE", native_checkpoints=True,
    backward="d500.backends.torch.operators:backward",
    operator_runner="d500.backends.torch.operators:TorchRunner", autograd=True, tie_rank=2,
    about="eager: the ONNX graph walked op by op in torch, IEEE float32",
    modes={"compiled": "the graph traced once into a static torch.fx program (shape-deciding "
                       "inputs baked), compiled by torch.compile (Inductor, one graph); its "
                       "training step's forward and backward likewise"})
