"""Pipeline parallelism as a level-3 scheme: each rank holds one stage of the cut model and runs
its share of a step as M micro-batches in the schedule's order; activations go forward and their
gradients back over the pipeline dimension's communicator; a stage's gradients, summed over the
micro-batches, are averaged over the data dimension (sync's allreduce) and the entry's optimizer
updates the stage's parameters.

    scheme = Pipeline(stage, grid, micro_batches=4, schedule="1f1b")
    loss = scheme.step(feeds, lr, weight)     # the last stage's: the share's loss; others 0.0

The last stage runs a micro-batch's forward and backward at once and sends its gradients back at
its forward's turn (its backward turns are empty), so the stage before never waits on the
schedule's order of the last stage's backwards. A step's sends are completed after the next
step's update (or at `settle`), not before its own: MPI learns that a send is done when its
receiver next calls it, so at M = 1 the last stage would wait for the first stage's next forward
before its update, which then lay on the step's critical path. Micro-batch i of n_i samples out
of the share's n is seeded at the last stage with n_i/n x the share's weight, so the summed
gradient is the share's weighted mean gradient: the update of one process on the whole batch (to
float rounding). The first stage reads `input`, the last reads `labels`: every rank of a
pipeline holds its data group's share of each batch.

Bytes per step, per rank: stage s sends each micro-batch's crossing tensors forward (n x the
partition's bytes per sample, "send") and receives their gradients back (as many, "recv").
`bubble_measured` is the time a stage waited for its neighbours over the time of its pipeline
passes (step minus the data allreduce and the update), beside `bubble_theory` (P-1)/(M+P-1);
`compute` holds the CPU seconds of its forwards and backwards (this process's, so not the time
other processes held the core: what the stage costs), from which schedule.simulate gives the
bubble of stages that do not cost the same (benchmarks/pipeline_bubble.py).
A weight held by several stages (partition.Partition.shared, a tied embedding) has its gradient
summed over them (each sends its own to the others, "send" traffic) before the data average,
so every copy takes the same update. For an evaluation every stage's parameters are sent to
rank 0 ("evaluate" traffic, on the judge's clock), which hands the whole model over.

With tensor > 1 each stage is split over its tensor group (split_stage.SplitStage): its tensor
ranks first join their shards on tensor rank 0, whose stage then goes to rank 0 as above; a
rank's bytes add its stage's blocks' allreduces on the tensor dimension ("tp").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from d500.distributed.pipeline import schedule as schedules
from d500.distributed.pipeline.partition import MAX_CROSSING
from d500.distributed.pipeline.stage import StageModel
from d500.distributed.schemes.sync import Sync

POLL = 0.00005  # seconds between tests of a stage waiting for a neighbour
GATHER = 1 << 20  # tags of the evaluation's gather (above any step's)
TIED = 1 << 19  # tags of a tied weight's gradient exchange (above any micro-batch's)


class Pipeline(Sync):
    """Stage `stage` on this rank of `grid` (see the module docstring)."""

    name = "pipeline"
    communicators = ("comm", "pipe", "tp")

    def __init__(self, stage: StageModel, grid: Any, micro_batches: int, schedule: str,
                 **kwargs: Any):
        super().__init__(stage.trainer, grid.data, **kwargs)
        self.stage, self.grid, self.pipe, self.tp = stage, grid, grid.pipeline, grid.tensor
        self.index, self.stages = stage.index, len(stage.part.stages)
        self.micro, self.schedule = micro_batches, schedule
        self.ops = schedules.ops(schedule, self.index, self.stages, micro_batches)
        self.holds_loss = stage.last
        self.idle = self.busy = 0.0  # seconds waiting for neighbours, seconds of passes
        self.compute = {"F": 0.0, "B": 0.0}  # CPU seconds of forwards, backwards (the last
        # stage's joint forward and backward under F): schedule.simulate's stage costs
        self.stash_peak = 0  # bytes kept for the backwards of micro-batches, at most
        self.gathered: dict[str, np.ndarray] | None = None
        self.sending: list[Any] = []  # the last step's sends, not yet known complete

    # ------------------------------------------------------------------ one step
    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        start = time.perf_counter()
        waited = self._waited()
        n = len(next(iter(feeds.values())))
        cuts = np.linspace(0, n, min(self.micro, n) + 1).astype(int)
        micro = [{k: v[a:b] for k, v in feeds.items()} for a, b in zip(cuts[:-1], cuts[1:])]
        grads: dict[str, np.ndarray] = {}
        stash: dict[int, Any] = {}
        requests: list[Any] = []
        loss, held = 0.0, 0
        st, s = self.stage, self.index
        ops = self.ops if len(micro) == self.micro else schedules.ops(
            self.schedule, s, self.stages, len(micro))  # a share smaller than M samples
        for kind, i in ops:
            size = len(next(iter(micro[i].values())))
            if kind == "F":
                received = self._receive(st.info.receives, size, s - 1, 2 * i)
                inputs = st.inputs(received, micro[i])
                t = time.process_time()
                if st.last:  # forward and backward at once, the gradients sent back now
                    part, g, back = st.loss(inputs, weight * size / n)
                    self.compute["F"] += time.process_time() - t
                    loss += part * size / n
                    _accumulate(grads, g)
                    requests += self._send(back, s - 1, 2 * i + 1)
                    continue
                sent, kept, nbytes = st.forward(inputs)
                self.compute["F"] += time.process_time() - t
                requests += self._send(sent, s + 1, 2 * i)
                stash[i] = kept, nbytes
                held += nbytes
                self.stash_peak = max(self.stash_peak, held)
            elif not st.last:
                kept, nbytes = stash.pop(i)
                held -= nbytes
                out = self._receive(st.info.sends, size, s + 1, 2 * i + 1)
                t = time.process_time()
                g, back = st.backward(kept, out)
                self.compute["B"] += time.process_time() - t
                _accumulate(grads, g)
                if s > 0:
                    requests += self._send(back, s - 1, 2 * i + 1)
        self._tie(grads)
        self.idle += self._waited() - waited
        self.busy += time.perf_counter() - start
        self.trainer.apply(self.average(grads), lr)
        self.pipe.wait(self.sending)  # the step before's: received then, done long since
        self.sending = requests  # this step's: completed next step, or at `settle`
        self.steps += 1
        return loss

    def settle(self) -> None:
        """The last step's sends completed (their receivers already hold them)."""
        self.pipe.wait(self.sending)
        self.sending = []

    def _tie(self, grads: dict[str, np.ndarray]) -> None:
        """Each tied weight's gradient summed over the stages holding it, in stage order on
        every one of them (the same float sum: the copies stay equal)."""
        shared = self.stage.part.shared
        for j, name in enumerate(sorted(n for n in shared if n in grads)):
            others = [s for s in shared[name] if s != self.index]
            sent = [self.pipe.isend(grads[name], s, TIED + j) for s in others]
            got = {s: self.pipe.recv(np.empty_like(grads[name]), s, TIED + j, POLL)
                   for s in others}
            got[self.index] = grads[name]
            total = np.array(got[shared[name][0]], copy=True)
            for s in shared[name][1:]:
                total += got[s]
            self.pipe.wait(sent)
            grads[name] = total

    def _receive(self, names: list[str], size: int, source: int, tag: int) -> list[np.ndarray]:
        return [self.pipe.recv(self.stage.part.buffer(t, size), source,
                               tag * MAX_CROSSING + j, POLL) for j, t in enumerate(names)]

    def _send(self, arrays: list[np.ndarray], dest: int, tag: int) -> list[Any]:
        return [self.pipe.isend(a, dest, tag * MAX_CROSSING + j) for j, a in enumerate(arrays)]

    def _waited(self) -> float:
        """Seconds this stage has spent waiting for its neighbours (receives, sends' ends)."""
        t = self.pipe.traffic
        return sum(t[k].seconds for k in ("recv", "send") if k in t)

    # ------------------------------------------------------------------ the whole model
    @contextlib.contextmanager
    def _evaluate(self) -> Iterator[None]:
        """Every stage's parameters sent to rank 0 (data and tensor coordinate 0)."""
        self.gathered = self._gather() if self.grid.coords["data"] == 0 else None
        yield

    def _gather(self) -> dict[str, np.ndarray] | None:
        part, shapes = self.stage.part, self._shapes()
        mine = self.params.get()
        if self.tp.size > 1:  # the stage's shards joined on its tensor rank 0 first
            from d500.distributed.tensor.scheme import join
            mine = join(self.tp, self.stage.split, mine)
            if mine is None:
                return None
        if self.index != 0:
            self.pipe.wait([self.pipe.isend(np.ascontiguousarray(mine[n]), 0, GATHER + j)
                            for j, n in enumerate(self.stage.info.params)])
            return None
        whole = {n: np.array(a, copy=True) for n, a in mine.items()}
        for s in part.stages[1:]:
            for j, name in enumerate(s.params):
                shape, dtype = shapes[name]
                whole[name] = self.pipe.recv(np.empty(shape, dtype), s.index, GATHER + j, POLL)
        return whole

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        from onnx import helper
        return {t.name: (tuple(t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)))
                for t in self.stage.part.model_proto.graph.initializer}

    def handed(self) -> dict[str, np.ndarray]:
        if self.gathered is None:
            raise RuntimeError("handed() outside evaluated() or off rank 0")
        return self.gathered

    # ------------------------------------------------------------------ figures
    def memory(self) -> dict[str, float]:
        out = super().memory()
        if self.tp.size > 1:  # a split stage's optimizer state lives in its segments' trainers
            out["optimizer_bytes"] = float(self.trainer.state_bytes())
        return out

    def figures(self) -> dict[str, float]:
        return {"bubble_measured": self.idle / self.busy if self.busy else 0.0,
                "bubble_theory": schedules.bubble(self.stages, self.micro),
                "pipeline_stage": float(self.index),
                "stash_bytes_peak": float(self.stash_peak)}

    def details(self) -> dict[str, Any]:
        out = {"partition": self.stage.part.record(), "schedule": self.schedule,
               "micro_batches": self.micro}
        if self.tp.size > 1:
            out["tensor_split"] = self.stage.split.record()
        return out


def _accumulate(total: dict[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
    for name, g in grads.items():
        if name in total:
            total[name] += g
        else:
            total[name] = np.array(g, dtype=g.dtype, copy=True)


def build(model: Any, spec: Any, grid: Any, backend_cls: Any, optimizer: Any, native: bool
          ) -> Pipeline:
    """This rank's Pipeline: `model` cut into spec.pipeline stages, its own stage translated
    (its shard of it, split spec.tensor ways, where that is > 1)."""
    from d500.distributed.pipeline.partition import cut
    part = cut(model, spec, where=f"{spec.where}: field 'distributed.pipeline'")
    if spec.tensor > 1:
        from d500.distributed.pipeline.split_stage import SplitStage
        stage: StageModel = SplitStage(part, grid.coords["pipeline"], backend_cls, optimizer,
                                       native, grid, f"{spec.where}: field 'distributed.tensor'")
    else:
        stage = StageModel(part, grid.coords["pipeline"], backend_cls, optimizer, native)
    return Pipeline(stage, grid, spec.micro_batches, spec.schedule,
                    bucket_bytes=spec.bucket_bytes, **spec.options)
