"""ZeRO stages 1 and 2 (Rajbhandari et al., SC'20) as the shard dimension of sync over the data
ranks: every rank still computes the whole gradient of its share, but keeps the optimizer state
of its own block of parameters only (stage 1), and of those gradients only the averaged block it
updates (stage 2); after its update every rank's block is allgathered into every model.

Blocks are whole parameters, cut contiguously in the model's parameter order so that each
rank's bytes are as close to B/N as whole tensors allow; whole tensors keep every optimizer's
per-tensor rules (LARS and LAMB's trust ratios) exactly as sync's. The update runs the entry's
framework-neutral optimizer on NumPy over the block (`optimizer.init(block, "numpy")`), in place
in the model's parameters; the trainer's own, replicated optimizer state is released.

Bytes per step and rank, model of B float32 parameter bytes, N data ranks, b_r rank r's block:
- stage 1: the gradients' allreduce, as sync ("allreduce": 2(N-1)/N * B each way), then the
  blocks' allgather ("allgatherv": B - b_{r+1} sent, B - b_r received);
- stage 2: the gradients' reduce-scatter ("reduce_scatter": B - b_r sent, B - b_{r+1}
  received), then the same allgather: as much as sync's allreduce, in two halves.

Memory per rank (`memory()`, bytes held across a step's update): parameters B (replicated);
gradients B at stage 1, b_r at stage 2 (the reduce-scatter's block; the backward pass's own
full gradient is the framework's transient, a peak not counted here); optimizer state: its
slots for the block only (e.g. Adam's 2 b_r + a counter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.schemes.base import Option, Scheme, state_bytes
from d500.errors import ConfigError


def blocks(sizes: list[int], ranks: int) -> list[int]:
    """Rank boundaries over tensors of `sizes` bytes: rank r owns tensors bounds[r]:bounds[r+1]
    (contiguous, whole tensors), each boundary the prefix nearest to r/N of the whole."""
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    bounds = [0]
    for r in range(1, ranks):
        target = prefix[-1] * r / ranks
        i = int(np.searchsorted(prefix, target))
        if i > 0 and (i == len(prefix) or target - prefix[i - 1] <= prefix[i] - target):
            i -= 1
        bounds.append(max(i, bounds[-1]))
    return [*bounds, len(sizes)]


class Zero(Scheme):
    """Synchronous data parallelism with the optimizer state (stage 1) and the averaged
    gradients (stage 2) sharded over the ranks (see the module docstring)."""

    name = "zero"
    options: ClassVar[dict[str, Option]] = {
        "stage": Option(1, "count", "1: optimizer state sharded; 2: gradients too")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        if self.stage not in (1, 2):
            raise ConfigError(f"scheme 'zero': stage {self.stage} is not built (stages 1, 2)")
        if getattr(trainer, "native", False):
            raise ConfigError("scheme 'zero' shards d500's framework-neutral optimizers' state; "
                              "a native (framework) optimizer keeps its own: use native: false")
        arrays = self.params.get()
        self.names = [n for n in arrays if n not in set(self.params.buffer_names)]
        for n in self.names:
            if arrays[n].dtype != np.float32:
                raise ConfigError(f"scheme 'zero' shards float32 parameters; '{n}' is "
                                  f"{arrays[n].dtype}")
        sizes = [arrays[n].nbytes for n in self.names]
        self.bounds = blocks(sizes, self.size)
        self.counts = [sum(arrays[n].size for n in self.names[self.bounds[r]:self.bounds[r + 1]])
                       for r in range(self.size)]
        self.mine = self.names[self.bounds[self.rank]:self.bounds[self.rank + 1]]
        self.optimizer = trainer.optimizer
        self.state = (self.optimizer.init({n: arrays[n] for n in self.mine}, "numpy")
                      if self.mine else None)
        self.replicated_state = state_bytes(getattr(trainer, "state", None))
        if hasattr(trainer, "state"):
            trainer.state = None  # this scheme updates through its own block's state only
        self.flat = np.empty(sum(self.counts), dtype=np.float32)
        self.buckets: Buckets | None = None
        self.param_bytes = sum(sizes)

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        loss, grads = self.gradients(feeds, weight)
        if self.stage == 1:
            if self.size > 1:
                if self.buckets is None:
                    self.buckets = Buckets(grads, self.bucket_bytes)
                self.buckets.allreduce(grads, self.comm, op="average")
            block = {n: grads[n] for n in self.mine}
        else:
            np.concatenate([grads[n].reshape(-1) for n in self.names], out=self.flat)
            mine = self.comm.reduce_scatter(self.flat, self.counts, op="average")
            block = self._unflatten(mine, self.mine)
        arrays = self.params.get()
        if self.state is not None:
            self.optimizer.step({n: arrays[n] for n in self.mine}, block, self.state, lr)
        self._allgather(arrays)
        self.steps += 1
        return loss

    def _unflatten(self, flat: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        shapes = self.trainer.parameter_shapes()
        out, at = {}, 0
        for n in names:
            size = int(np.prod(shapes[n], dtype=np.int64))
            out[n] = flat[at:at + size].reshape(shapes[n])
            at += size
        return out

    def _allgather(self, arrays: dict[str, np.ndarray]) -> None:
        """Every rank's updated block into every rank's parameters."""
        if self.size == 1:
            self.params.put(arrays)
            return
        mine = (np.concatenate([arrays[n].reshape(-1) for n in self.mine]) if self.mine
                else np.empty(0, np.float32))
        parts = self.comm.allgatherv(mine, self.counts)
        for r, part in enumerate(parts):
            names = self.names[self.bounds[r]:self.bounds[r + 1]]
            for n, a in self._unflatten(part, names).items():
                np.copyto(arrays[n], a)
        self.params.put(arrays)

    def _finish(self) -> None:
        """The parameters are equal on every rank; the running statistics become rank 0's."""
        self.broadcast_buffers(0)

    def memory(self) -> dict[str, float]:
        """Bytes this rank holds across an update (module docstring)."""
        block = 4 * self.counts[self.rank]
        return {"param_bytes": float(self.param_bytes),
                "grad_bytes": float(self.param_bytes if self.stage == 1 else block),
                "optimizer_bytes": float(state_bytes(self.state))}

    def figures(self) -> dict[str, float]:
        return {**self.memory(), "zero_stage": float(self.stage),
                "replicated_optimizer_bytes": float(self.replicated_state)}
