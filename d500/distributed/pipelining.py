"""The native pipeline baseline: `torch.distributed.pipelining` (PipelineStage with ScheduleGPipe or
Schedule1F1B, gloo, CPU tensors) on the stages d500's cut makes, launched as the ddp baseline is
(rank and world size from MPI, d500.distributed.ddp.init_group).

    scheme = PipeliningScheme(stage, comm, micro_batches=4, schedule="1f1b")
    scheme.start()                      # process group, PipelineStage, the schedule
    loss = scheme.step(feeds, lr)       # the last stage's: the batch's loss; others 0.0

Rank s holds stage s of d500.distributed.pipeline.partition's cut, translated by the torch
backend (the same sub-model `pipeline-gpipe` and `pipeline-1f1b` run), as an nn.Module whose
forward takes the tensors it receives (and, as keyword arguments, the graph inputs it reads: the
first stage's `input`, the last's `labels`) and returns what it sends; the last returns its loss.
torch's schedule splits the batch into M micro-batches (torch.tensor_split's sizes), runs their
forwards and backwards in its order with its own P2P sends, and the loss function weighs
micro-batch i's loss by n_i/n (scale_grads off), so the summed gradients are the batch's mean
gradient, as d500's pipeline seeds them. The entry's optimizer then updates the stage.

Bytes per step, per rank, counted by formula from the tensors the cut makes cross, in torch's
micro-batches (its P2P sends move exactly those): forward, what a stage sends on; backward, the
gradients of what it received (its first step also sends their shapes: not counted). Memory: the
stage's parameters, which the judge checks against its own cut,
as for `pipeline-gpipe`; the judge audits the loss after each hand-over likewise. torch measures
no bubble: the step time is what benchmarks/pipeline_bubble.py compares. Checkpoints
(d500.distributed.resuming): a rank's piece is its stage's trainer (parameters and the entry's
optimizer state), at its pipeline coordinate (its rank), as a d500 pipeline stage's.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Communicator, Traffic
from d500.distributed.ddp import Stepped, close_group
from d500.errors import UsageError

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}  # spec.schedule -> torch's


class PipeliningScheme(Stepped):
    """torch.distributed.pipelining as a level-3 scheme (see the module docstring)."""

    name: ClassVar[str] = "pipelining"
    # how its traffic is named in its figures, and d500 scale times it (scaling.KINDS):
    traffic_name: ClassVar[str] = "pipelining_send"  # the stages' point-to-point sends
    dimension: ClassVar[str] = "pipeline"  # the one it cuts, over the whole world

    def __init__(self, stage: Any, comm: Communicator, micro_batches: int, schedule: str, *,
                 reducer: Any = None, timeout: float = 60.0, **options: Any):
        from d500.distributed.ddp import torch_trainer
        torch_trainer("pipelining", stage.trainer, reducer, options, own_update=True)
        self.stage, self.world = stage, comm
        self.comm = Communicator.single()  # the data dimension: every stage sees the batch
        self.trainer = stage.trainer
        self.micro, self.schedule_name, self.timeout = micro_batches, schedule, timeout
        self.holds_loss = stage.last
        self.schedule: Any = None
        self.module: Any = None
        self.full: dict[str, np.ndarray] | None = None
        self.traffic = Traffic()  # counted by formula (module docstring)
        self._steps = 0

    def start(self) -> None:
        """The process group, this rank's PipelineStage and torch's schedule over it."""
        import torch
        from torch.distributed import pipelining

        from d500.distributed.ddp import init_group
        init_group(self.world, self.timeout)
        self.module = _stage_module()(self.stage)
        s = self.stage
        piped = pipelining.PipelineStage(self.module, s.index, len(s.part.stages),
                                         torch.device("cpu"))
        kind = getattr(pipelining, SCHEDULES[self.schedule_name])
        self.schedule = kind(piped, self.micro, loss_fn=self._loss, scale_grads=False)
        self._n, self._weight = 1, 1.0

    def _loss(self, loss: Any, labels: Any) -> Any:
        """Micro-batch i's loss weighted by n_i/n (and the share's weight): summed, the batch's
        mean loss, and so its gradients."""
        return loss * (self._weight * len(labels) / self._n)

    def _count(self, n: int) -> None:
        """One step's crossings in torch's micro-batches of `n` samples: what this stage sends
        forward and the gradients of what it received (as many come back the other way)."""
        s = self.stage
        names = ([] if s.last else s.info.sends) + ([] if s.index == 0 else s.info.receives)
        for size in (len(c) for c in np.array_split(np.arange(n), min(self.micro, n))):
            for t in names:
                nbytes = s.part.buffer(t, size).nbytes
                self.traffic.sent += nbytes
                self.traffic.received += nbytes
                self.traffic.calls += 2

    def step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        """torch's schedule over the batch (its sends, receives, forwards and backwards), then
        the entry's optimizer on this stage's gradients."""
        import torch
        s, t = self.stage, self.trainer
        labels = torch.from_numpy(feeds["labels"])
        _equal(len(labels), self.micro)
        self._n, self._weight = len(labels), weight
        kwargs = {n: torch.from_numpy(feeds[n]) for n in s.info.feeds if n != "input"}
        args = (torch.from_numpy(feeds["input"]),) if s.index == 0 else ()
        losses: list[Any] = []
        with torch.enable_grad():
            self.schedule.step(*args, target=labels if s.last else None,
                               losses=losses if s.last else None, return_outputs=False,
                               **kwargs)
        grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p))
                 for n, p in zip(t.names, t.params)}
        with torch.no_grad():
            t.optimizer.step(t.named, grads, t.state, lr)
        for p in t.params:
            p.grad = None
        self._count(len(labels))
        self._steps += 1
        return float(sum(x.item() for x in losses) / weight) if s.last else 0.0

    @contextmanager
    def evaluated(self) -> Any:
        """Every stage's parameters gathered on rank 0 (over MPI; evaluation traffic)."""
        mine = {n: a.copy() for n, a in self.trainer.parameters().items()}
        every = self.world.mpi.gather(mine, root=0)
        self.full = {k: v for d in every for k, v in d.items()} if every else None
        try:
            yield
        finally:
            self.full = None

    def handed(self) -> dict[str, np.ndarray]:
        if self.full is None:
            raise RuntimeError("handed() outside evaluated() or off rank 0")
        return self.full

    def finish(self) -> None:
        """The process group closes on every rank together."""
        close_group()

    def memory(self) -> dict[str, float]:
        """Bytes of this stage's parameters (their gradients: the same) and optimizer state."""
        from d500.distributed.ddp import held
        return held(self.trainer.params, self.trainer.state)

    def figures(self) -> dict[str, float]:
        return {"pipeline_stage": float(self.stage.index)}

    def details(self) -> dict[str, Any]:
        return {"partition": self.stage.part.record(), "schedule": self.schedule_name,
                "micro_batches": self.micro, "torch_schedule": SCHEDULES[self.schedule_name]}


def _equal(batch: int, micro: int, where: str = "the pipelining baseline") -> None:
    """A UsageError unless `micro` divides `batch`: torch's schedule receives every micro-batch
    into buffers shaped as the first one (unequal ones fail inside torch)."""
    if batch % micro:
        raise UsageError(f"{where}: field 'distributed.micro_batches': the pipelining baseline "
                         f"needs micro-batches of equal size: batch {batch} does not divide "
                         f"into {micro} (torch.distributed.pipelining keeps the first one's "
                         f"shapes)")


def _stage_module() -> Any:
    import torch

    class Stage(torch.nn.Module):
        """A stage's translated sub-model as torch's pipelining calls it: the received tensors
        positional, the graph inputs it reads by name; what it sends (the last: its loss)."""

        def __init__(self, stage: Any):
            super().__init__()
            self.graph = stage.exe.native  # the GraphModule: its parameters are the stage's
            self.stage = stage
            names = stage.exe.output_names
            self.outputs = [names.index(n) for n in
                            ([stage.loss_name] if stage.last else stage.sent_names)]

        def forward(self, *received: Any, **batch: Any) -> Any:
            s = self.stage
            named = dict(zip(s.info.receives, received))
            if s.index == 0:
                named.update(zip([n for n in s.info.feeds if n == "input"], received))
            named.update(batch)
            outs = self.graph(**named)
            sent = [outs[i] for i in self.outputs]
            return sent[0] if s.last else tuple(sent)
    return Stage


def build(model: Any, spec: Any, comm: Communicator, backend_cls: Any, optimizer: Any,
          native: bool, limit: float, batch: int | None = None) -> tuple[Any, PipeliningScheme]:
    """(trainer, scheme) of this rank: `model` cut into spec.pipeline stages (d500's cut), its
    own stage translated, torch's schedule over it; refused where spec.micro_batches does not
    divide the global `batch`, or (1F1B) is below the stage count."""
    from d500.distributed.ddp import whole_world
    whole_world(spec, comm, "pipeline")
    if batch is not None:
        _equal(batch, spec.micro_batches, spec.where)
    if spec.schedule == "1f1b" and spec.micro_batches < spec.pipeline:
        raise UsageError(f"{spec.where}: field 'distributed.micro_batches': torch's Schedule1F1B "
                         f"needs at least one micro-batch per stage ({spec.micro_batches} < "
                         f"{spec.pipeline} stages)")
    from d500.distributed.pipeline.partition import partition
    from d500.distributed.pipeline.stage import StageModel
    part = partition(model, spec.pipeline, where=f"{spec.where}: field 'distributed.pipeline'")
    if part.shared:  # torch's stages would update their copies of a tied weight apart
        raise UsageError(f"{spec.where}: field 'distributed.pipeline': parameter "
                         f"'{sorted(part.shared)[0]}' is read in two pipeline stages (a tied "
                         f"weight); the pipelining baseline cannot sum its gradients across "
                         f"stages (d500's pipeline entries do)")
    stage = StageModel(part, comm.rank % spec.pipeline, backend_cls, optimizer, native)
    return stage.trainer, PipeliningScheme(stage, comm, spec.micro_batches, spec.schedule,
                                           timeout=limit, **spec.options)
