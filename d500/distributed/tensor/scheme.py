"""Tensor parallelism as a level-3 scheme: each rank holds its tensor coordinate's shard of the
split weights (and every replicated weight), computes each step's whole share of the batch with
its tensor group (RankModel's allreduces over the tensor dimension), averages its gradients over
the data dimension (sync's allreduce) and updates its own weights with the entry's optimizer.

    scheme = TensorParallel(RankModel(...), grid)
    loss = scheme.step(feeds, lr, weight)     # every tensor rank: the share's whole loss

Bytes per step, per rank, on the tensor dimension ("allreduce"): per block, its partial output
forward and its input's gradient backward (where the input depends on a weight), each
2(T-1)/T x the activation's bytes. For an evaluation the shards are sent to rank 0 (data and
tensor coordinate 0; "evaluate" traffic, on the judge's clock), which hands the whole model over,
every split weight concatenated back along its axis.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from d500.distributed.schemes.sync import Sync
from d500.distributed.tensor.rank import RankModel
from d500.distributed.tensor.split import Split

POLL = 0.00005  # seconds between tests of rank 0 waiting for a shard
GATHER = 1 << 20  # tags of the evaluation's gather


class TensorParallel(Sync):
    """This rank's RankModel on `grid` (see the module docstring)."""

    name = "tensor"
    communicators = ("comm", "tp")

    def __init__(self, model: RankModel, grid: Any, **kwargs: Any):
        super().__init__(model.trainer, grid.data, **kwargs)
        self.model, self.grid, self.tp = model, grid, grid.tensor
        self.gathered: dict[str, np.ndarray] | None = None

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        loss, grads = self.model.gradients(dict(feeds), weight)
        self.trainer.apply(self.average(grads), lr)
        self.steps += 1
        return loss

    @contextlib.contextmanager
    def _evaluate(self) -> Iterator[None]:
        """Every tensor rank's shards sent to rank 0 (data coordinate 0)."""
        self.gathered = self._gather() if self.grid.coords["data"] == 0 else None
        yield

    def _gather(self) -> dict[str, np.ndarray] | None:
        return join(self.tp, self.model.split, self.params.get())

    def handed(self) -> dict[str, np.ndarray]:
        if self.gathered is None:
            raise RuntimeError("handed() outside evaluated() or off rank 0")
        return self.gathered

    def memory(self) -> dict[str, float]:
        p = float(sum(a.nbytes for a in self.params.get().values()))
        return {"param_bytes": p, "grad_bytes": p,
                "optimizer_bytes": float(self.model.trainer.state_bytes())}

    def figures(self) -> dict[str, float]:
        return {"tensor_rank": float(self.grid.coords["tensor"])}

    def details(self) -> dict[str, Any]:
        return {"tensor_split": self.model.split.record()}


def join(tp: Any, split: Split, mine: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Every tensor rank's shards (`mine`) sent to tensor rank 0 of `tp`, which gets the whole
    model back (each split weight concatenated along its axis); None on the other ranks."""
    names = sorted(split.axes)
    if tp.rank != 0:
        tp.wait([tp.isend(np.ascontiguousarray(mine[n]), 0, GATHER + j)
                 for j, n in enumerate(names)])
        return None
    whole = {n: np.array(a, copy=True) for n, a in mine.items()}
    for j, n in enumerate(names):
        parts = [whole[n]] + [tp.recv(np.empty_like(whole[n]), r, GATHER + j, POLL)
                              for r in range(1, tp.size)]
        whole[n] = np.concatenate(parts, axis=split.axes[n])
    return whole


def build(model: Any, spec: Any, grid: Any, backend_cls: Any, optimizer: Any, native: bool
          ) -> TensorParallel:
    """This rank's TensorParallel: `model` split spec.tensor ways, its own shard translated."""
    from d500.distributed.tensor.split import find
    split = find(model, spec.tensor, where=f"{spec.where}: field 'distributed.tensor'")
    tp = grid.tensor
    rank = RankModel(split, grid.coords["tensor"], backend_cls, optimizer, native,
                     lambda a: tp.allreduce(a, op="sum"))
    return TensorParallel(rank, grid, bucket_bytes=spec.bucket_bytes, **spec.options)
