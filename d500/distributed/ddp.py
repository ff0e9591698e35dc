"""The native baseline: torch DistributedDataParallel (gloo) on the same translated model, batches
and optimizer as d500's schemes, launched the same way (rank and world size from MPI), so "d500's
allreduce against what torch users would use" is one leaderboard comparison.

    scheme = DDPScheme(trainer, comm, bucket_bytes=25 * 2**20)   # trainer: a torch Trainer
    scheme.start()              # process group (TCP rendezvous, port from rank 0 over MPI), DDP
    loss = scheme.step(feeds, lr)

The model is the torch backend's translation of the workload's ONNX model (a torch.nn.Module),
wrapped in DDP with `bucket_cap_mb` from the entry; DDP allreduces gradient buckets during the
backward pass, then the entry's optimizer updates through the Trainer's `apply`, exactly as the
d500 schemes' updates do. The rendezvous is a TCP store on rank 0: 127.0.0.1 when every rank is
on one host, else rank 0's host name, and a free port rank 0 picked, broadcast over MPI.

Bytes are counted by a DDP communication hook around torch's own allreduce hook, per bucket with
the ring formula the Communicator uses for MPI's allreduce. DDP overlaps its allreduces with the
backward pass, so time in communication is not separable from computation from the outside; it
is not reported (only the step time is).

DDP wraps the trainer's `train_module` (the model's training form: BatchNormalization with batch
statistics), with forward_sync_buffers=False: running statistics per rank, as in d500's sync
scheme (see schemes/base.py); `finish` broadcasts rank 0's.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Communicator, Traffic, ring_counts
from d500.errors import ConfigError, UsageError


@dataclasses.dataclass
class _HookState:
    rank: int
    world: int
    traffic: Traffic = dataclasses.field(default_factory=Traffic)


def _counting_hook(state, bucket):  # unannotated: torch reads the annotations
    """torch's allreduce hook (average over ranks), with the bucket's bytes counted (unannotated:
    DDP refuses a hook whose `bucket` annotation is not dist.GradBucket, and this module's
    annotations are strings)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    buffer = bucket.buffer()
    sent, received = ring_counts(buffer.numel(), state.world, state.rank)
    state.traffic.calls += 1
    state.traffic.sent += sent * buffer.element_size()
    state.traffic.received += received * buffer.element_size()
    return allreduce_hook(None, bucket)


def rendezvous(comm: Communicator) -> tuple[str, int]:
    """(address, port) of the TCP store on rank 0, agreed over MPI."""
    hosts = comm.mpi.allgather(socket.gethostname())
    port = 0
    if comm.rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    port = comm.mpi.bcast(port, root=0)
    address = os.environ.get("MASTER_ADDR") or (
        "127.0.0.1" if len(set(hosts)) == 1 else hosts[0])
    return address, int(port)


def init_group(comm: Communicator, timeout: float) -> None:
    """torch.distributed's gloo process group over the MPI world (once per process)."""
    import torch.distributed as dist
    if dist.is_initialized():
        if dist.get_world_size() != comm.size or dist.get_rank() != comm.rank:
            raise UsageError("torch.distributed is already initialised with another world")
        return
    address, port = rendezvous(comm)
    if address == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=comm.rank,
                            world_size=comm.size,
                            timeout=datetime.timedelta(seconds=max(timeout, 1.0)))


def torch_trainer(scheme: str, trainer: Any, reducer: Any, options: dict[str, Any],
                  own_update: bool = False) -> Any:
    """The checks every torch-native baseline makes of what it is built with: no options, no
    compression, a torch Trainer (its training module returned), and where the baseline updates
    its own shards with d500's optimizers (`own_update`), not a native optimizer."""
    if options:
        raise ConfigError(f"scheme '{scheme}' has no option '{min(options)}' (it takes none; "
                          f"the bucket size is 'bucket_mb')")
    if reducer is not None:
        raise ConfigError(f"scheme '{scheme}' takes no compression")
    module = getattr(trainer, "train_module", None)
    import torch
    if not isinstance(module, torch.nn.Module) or not hasattr(trainer, "params"):
        raise UsageError(f"the {scheme} baseline runs on the torch backend only (--backend "
                         f"torch)")
    if own_update and getattr(trainer, "native", False):
        raise ConfigError(f"the {scheme} baseline updates its shards with d500's optimizers: "
                          f"use native: false")
    return module


def whole_world(spec: Any, comm: Communicator, dimension: str) -> None:
    """A UsageError naming the entry's field unless `dimension` (a model-parallel baseline's:
    tensor, pipeline) spans every rank: the baselines split nothing else (data: 1)."""
    parts = getattr(spec, dimension)
    if comm.size != parts:
        raise UsageError(f"{spec.where}: field 'distributed.{dimension}': the {spec.scheme} "
                         f"baseline puts one part per rank and splits nothing else (data: 1): "
                         f"{dimension} {parts} runs at {parts} ranks, not {comm.size}")


def held(tensors: Any, state: Any) -> dict[str, float]:
    """A torch-native baseline's memory(): the storage bytes of the (local) parameter tensors it
    holds, as many for their gradients, and the bytes of the optimizer state over them."""
    from d500.distributed.schemes.base import state_bytes
    nbytes = float(sum(t.untyped_storage().nbytes() for t in tensors))
    return {"param_bytes": nbytes, "grad_bytes": nbytes,
            "optimizer_bytes": float(state_bytes(state))}


def with_buffers(full: dict[str, np.ndarray], trainer: Any) -> dict[str, np.ndarray]:
    """A baseline's hand-over: the full parameters gathered and copies of the trainer's
    running statistics."""
    return {**full, **{n: np.array(v.detach().numpy(), copy=True)
                       for n, v in trainer.buffers().items()}}


def close_group(trainer: Any = None) -> None:
    """The process group closed on every rank together (left open, the first rank to exit breaks
    the others' gloo connections); first, rank 0's buffers of `trainer` (running statistics)
    everywhere."""
    import torch.distributed as dist
    if trainer is not None:
        values = trainer.values
        for name in trainer.buffer_names:
            dist.broadcast(values[name], 0)
    dist.barrier()
    dist.destroy_process_group()


class Stepped:
    """What a scheme of torch's own (DDP, FSDP, DTensor, pipelining) checkpoints of itself: its
    step count. The model and the optimizer's state are its trainer's (d500.distributed.resuming,
    as a sync rank's) or, cut across ranks, each rank's `piece` (shards, a stage's weights);
    torch leaves nothing of a step in flight."""

    _steps = 0

    def settle(self) -> None:
        """Nothing in flight between steps."""

    def saved(self) -> dict[str, np.ndarray]:
        """Its step count, for a checkpoint."""
        return {"steps": np.asarray(self._steps, np.int64)}

    def restored(self, arrays: dict[str, np.ndarray]) -> None:
        self._steps = int(arrays["steps"])


class DDPScheme(Stepped):
    """torch DDP as a level-3 scheme (the Scheme interface of d500.distributed.schemes)."""

    name: ClassVar[str] = "ddp"
    # how its traffic is named in its figures, and d500 scale times it (scaling.KINDS):
    traffic_name: ClassVar[str] = "ddp_allreduce"  # its buckets' allreduces
    holds_loss = True

    def __init__(self, trainer: Any, comm: Communicator, *, reducer: Any = None,
                 bucket_bytes: int = 25 * 2**20, timeout: float = 60.0, **options: Any):
        module = torch_trainer("ddp", trainer, reducer, options)
        self.trainer, self.comm, self.module = trainer, comm, module
        self.bucket_bytes, self.timeout = bucket_bytes, timeout
        self.state = _HookState(comm.rank, comm.size)
        self.ddp: Any = None
        self._steps = 0

    @property
    def traffic(self) -> Traffic:
        """Bytes DDP's allreduces moved for this rank (counted by the hook); no seconds."""
        return self.state.traffic

    def start(self) -> None:
        """The process group and the DDP wrapper; DDP broadcasts rank 0's parameters."""
        from torch.nn.parallel import DistributedDataParallel
        if self.comm.mpi is not None:
            init_group(self.comm, self.timeout)
        else:
            return  # one rank: the module trains as it is
        self.ddp = DistributedDataParallel(self.module, bucket_cap_mb=self.bucket_bytes / 2**20,
                                           forward_sync_buffers=False)  # synced at start only
        self.ddp.register_comm_hook(self.state, _counting_hook)

    def step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        """Forward through DDP, backward of the loss x `weight` (the share's weight, as the
        d500 schemes' gradients: schemes/base.py; DDP's bucketed allreduce runs inside it),
        then the entry's optimizer from the averaged param.grad."""
        import torch
        t = self.trainer
        inputs = {name: torch.from_numpy(a) for name, a in
                  t.batch(feeds, t.train_inputs).items()}
        model = self.ddp if self.ddp is not None else self.module
        with torch.enable_grad():
            loss = model(**inputs)
            (loss * weight if weight != 1.0 else loss).backward()
        grads = {n: p.grad.numpy() for n, p in zip(t.names, t.params)}
        t.apply(grads, lr)
        for p in t.params:
            p.grad = None
        self._steps += 1
        return float(loss.item())

    @contextmanager
    def evaluated(self) -> Any:
        """Every rank holds the same model under DDP: nothing to do."""
        yield

    def handed(self) -> dict[str, np.ndarray]:
        from d500.distributed.schemes.base import model_state
        return model_state(self.trainer)

    def finish(self) -> None:
        """Every rank already holds the final model; the process group is closed on every rank
        together (left open, the first rank to exit breaks the others' gloo connections)."""
        if self.ddp is None:
            return
        self.ddp = None
        close_group(self.trainer)

    def figures(self) -> dict[str, float]:
        return {}

    def details(self) -> dict[str, Any]:
        return {"ddp_buckets_per_step": (self.state.traffic.calls / self._steps
                                         if self._steps else 0)}
