"""The native sharded baseline: torch FSDP2 (`torch.distributed.fsdp.fully_shard`, gloo, CPU
tensors) on the same translated model, batches and optimizer as d500's ZeRO schemes, launched as
the ddp baseline is (rank and world size from MPI, d500.distributed.ddp.init_group).

    scheme = FSDPScheme(trainer, comm)       # trainer: a torch Trainer
    scheme.start()                           # process group, fully_shard of the model
    loss = scheme.step(feeds, lr)

The translated ONNX graph keeps its parameters flat on one module, so the whole model is one FSDP
unit, as d500's zero3 gathers it: FSDP allgathers it before the forward, frees it after, gathers
it again for the backward (reshard_after_forward, FSDP2's default) and reduce-scatters the
gradients. Each parameter is sharded on its first axis (Shard(0)); the entry's framework-neutral
optimizer updates each rank's local shards (`to_local()`) in place, which for elementwise rules
(SGD, momentum, Adam) is the whole model's update. Rank 0 hands the judge the full tensors
(`full_tensor()`, a collective on every rank inside `evaluated()`).

Bytes are counted by the formula of what FSDP2 runs per step and rank, L its local shard bytes
and P the padded model (N L): the allgather before the forward and again before the backward
((N-1) L sent and received each), then the gradients' reduce-scatter ((N-1) L each way); its
collectives run inside torch, so their time is not separable (only the step time is reported).
Memory (`memory()`): the local shards of the parameters and gradients and the optimizer state
over them, as allocated (padding included).

Checkpoints (d500.distributed.resuming): a rank's piece is its local shards and the optimizer
state over them (`Shards`, read and written in place through `to_local()`), as ZeRO-3's rows
are; the whole model is gathered for the judge as for an evaluation.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Communicator, Traffic
from d500.distributed.ddp import Stepped, close_group


class FSDPScheme(Stepped):
    """torch FSDP2 as a level-3 scheme (the Scheme interface of d500.distributed.schemes)."""

    name: ClassVar[str] = "fsdp"
    # how its traffic is named in its figures, and d500 scale times it (scaling.KINDS):
    traffic_name: ClassVar[str] = "fsdp_gather_scatter"  # allgathers and a reduce-scatter of blocks
    holds_loss = True

    def __init__(self, trainer: Any, comm: Communicator, *, reducer: Any = None,
                 bucket_bytes: int = 25 * 2**20, timeout: float = 60.0, **options: Any):
        from d500.distributed.ddp import torch_trainer
        step = torch_trainer("fsdp", trainer, reducer, options, own_update=True)
        self.trainer, self.comm, self.step_module = trainer, comm, step
        self.timeout = timeout
        self.graph = step.graph  # the GraphModule holding the parameters
        self.names = {attr: name for name, attr in self.graph.attr_names.items()
                      if name in set(trainer.names)}
        self.sharded: Any = None
        self.state: Any = None
        self.full: dict[str, np.ndarray] = {}
        self.traffic = Traffic()  # counted by formula (module docstring)
        self._steps = 0
        self.piece = Shards(self)  # what a checkpoint reads and writes (module docstring)

    def start(self) -> None:
        """The process group, then fully_shard of the model (rank 0's parameters first)."""
        from torch.distributed.fsdp import fully_shard

        from d500.distributed.ddp import init_group
        if self.comm.mpi is not None:
            init_group(self.comm, self.timeout)
            import torch.distributed as dist
            for p in self.trainer.params:  # every rank from rank 0's model, as DDP starts
                dist.broadcast(p.data, 0)
        self.sharded = fully_shard(_Forward(self.graph, self.step_module))
        self.state = self.trainer.optimizer.init(self._local(), "torch")
        self.trainer.state = None  # the replicated state is released

    def _local(self) -> dict[str, Any]:
        """This rank's shard of every parameter, by ONNX name (views the optimizer updates)."""
        return {self.names[n.split(".")[-1]]: p.to_local()
                for n, p in self.sharded.named_parameters()}

    def _grads(self) -> dict[str, Any]:
        return {self.names[n.split(".")[-1]]: p.grad.to_local()
                for n, p in self.sharded.named_parameters()}

    def step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        """Forward and backward through FSDP (its allgathers and reduce-scatter inside), the loss
        times `weight` (schemes/base.py), then the entry's optimizer on the local shards."""
        import torch
        t = self.trainer
        inputs = {name: torch.from_numpy(a) for name, a in
                  t.batch(feeds, t.train_inputs).items()}
        with torch.enable_grad():
            loss = self.sharded(**inputs)
            (loss * weight if weight != 1.0 else loss).backward()
        with torch.no_grad():
            t.optimizer.step(self._local(), self._grads(), self.state, lr)
        for p in self.sharded.parameters():
            p.grad = None
        self._count()
        self._steps += 1
        return float(loss.item())

    def _count(self) -> None:
        """One step's bytes (module docstring)."""
        if self.comm.size == 1:
            return
        local = sum(p.to_local().numel() * p.element_size() for p in self.sharded.parameters())
        moved = 3 * (self.comm.size - 1) * local
        self.traffic.calls += 3
        self.traffic.sent += moved
        self.traffic.received += moved

    @contextmanager
    def evaluated(self) -> Any:
        """The full parameters gathered on every rank (full_tensor is collective), for rank 0."""
        self.full = {self.names[n.split(".")[-1]]: p.full_tensor().detach().numpy().copy()
                     for n, p in self.sharded.named_parameters()}
        try:
            yield
        finally:
            self.full = {}

    def handed(self) -> dict[str, np.ndarray]:
        from d500.distributed.ddp import with_buffers
        return with_buffers(self.full, self.trainer)

    def finish(self) -> None:
        """Every rank gets the full model back into its trainer; the process group closes on
        every rank together."""
        with self.evaluated():
            full = dict(self.full)
        import torch
        for name, p in zip(self.trainer.names, self.trainer.params):
            p.data = torch.from_numpy(full[name])
        if self.comm.mpi is None:
            return
        close_group(self.trainer)

    def memory(self) -> dict[str, float]:
        """Bytes of this rank's local shards (parameters, last gradients: their size) and the
        optimizer state (module docstring)."""
        from d500.distributed.ddp import held
        return held([p.to_local() for p in self.sharded.parameters()], self.state)

    def figures(self) -> dict[str, float]:
        return {}

    def details(self) -> dict[str, Any]:
        return {}


class Shards:
    """A rank's local shards of every parameter and their optimizer state, as the part of a
    Trainer a checkpoint reads and writes (d500.training.checkpoint.capture and restore); of a
    native baseline whose `_local()` gives its tensors by ONNX name (FSDP2's, DTensor's)."""

    def __init__(self, scheme: Any):
        self.scheme = scheme

    @property
    def parameter_names(self) -> list[str]:
        return list(self.scheme._local())

    @property
    def buffer_names(self) -> list[str]:
        return list(self.scheme.trainer.buffer_names)

    @property
    def state(self) -> Any:
        return self.scheme.state

    def parameters(self) -> dict[str, np.ndarray]:
        return {n: t.detach().numpy().copy() for n, t in self.scheme._local().items()}

    def set_parameters(self, values: dict[str, np.ndarray]) -> None:
        import torch
        with torch.no_grad():
            for n, t in self.scheme._local().items():
                t.copy_(torch.from_numpy(np.ascontiguousarray(values[n], np.float32)))

    def buffers(self) -> dict[str, np.ndarray]:
        return self.scheme.trainer.buffers()

    def set_buffers(self, values: dict[str, np.ndarray]) -> None:
        self.scheme.trainer.set_buffers(values)


def _forward_module() -> Any:
    import torch

    class Forward(torch.nn.Module):
        """The training forward reading the graph's parameters as registered now (FSDP swaps
        the unsharded tensors in before each forward and backward)."""

        def __init__(self, graph: Any, step: Any):
            super().__init__()
            self.graph = graph
            self.step = step

        def forward(self, **inputs: Any) -> Any:
            g = self.graph
            env = {name: getattr(g, attr) for name, attr in g.attr_names.items()}
            env.update(g.constants)
            env.update(inputs)
            return self.step.run(env)
    return Forward


def _Forward(graph: Any, step: Any) -> Any:  # noqa: N802 - a class, built where torch is imported
    return _forward_module()(graph, step)
