"""ZeRO stages 1, 2 and 3 (Rajbhandari et al., SC'20) as the shard dimension of sync over the data
ranks: every rank still computes the whole gradient of its share, but keeps the optimizer state
of its own block of parameters only (stage 1), and of those gradients only the averaged block it
updates (stage 2); after its update every rank's block is allgathered into every model. Stage 3
keeps the parameters of its block only: the other blocks' storage is freed after each step and
allgathered again before the next forward (the whole model at once, see below).

Blocks are whole parameters, cut contiguously in the model's parameter order so that each
rank's bytes are as close to B/N as whole tensors allow; whole tensors keep every optimizer's
per-tensor rules (LARS and LAMB's trust ratios) exactly as sync's. The update runs the entry's
framework-neutral optimizer on NumPy over the block (`optimizer.init(block, "numpy")`), in place
in the model's parameters; the trainer's own, replicated optimizer state is released.

Bytes per step and rank, model of B float32 parameter bytes, N data ranks, b_r rank r's block:
- stage 1: the gradients' allreduce, as sync ("allreduce": 2(N-1)/N * B each way), then the
  blocks' allgather ("allgatherv": B - b_{r+1} sent, B - b_r received);
- stage 2: the gradients' reduce-scatter ("reduce_scatter": B - b_r sent, B - b_{r+1}
  received), then the same allgather: as much as sync's allreduce, in two halves;
- stage 3: the same allgather before the forward pass, the same reduce-scatter after the
  backward: as stage 2 (per-layer ZeRO-3 gathers again for the backward, 1.5x).

Stage 3 here gathers the whole model, not one layer at a time: it runs the ONNX graph as one
torch program whose autograd keeps every weight it used until the backward ends. It serves models
with running statistics (BatchNormalization); any other model is run layer by layer, in segments,
by d500.distributed.schemes.zero3. Held between steps: b_r; the peak inside a step: B (stated as
`peak_param_bytes`, as stages 1 and 2 state theirs). Freeing storage is torch's
(`param.data`), so stage 3 runs on the torch backend on CPU only. Rank 0 gathers the whole model
for each evaluation (traffic "evaluate").

Memory per rank (`memory()`, bytes held across a step's update): parameters B (replicated;
stage 3: the bytes of parameter storage the torch tensors hold, measured, b_r); gradients B at
stage 1, b_r at stages 2 and 3 (the reduce-scatter's block; the backward pass's own full gradient
is the framework's transient, a peak not counted here); optimizer state: its slots for the block
only (e.g. Adam's 2 b_r + a counter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from d500.distributed.buckets import Buckets
from d500.distributed.schemes.base import Option, Scheme, state_bytes
from d500.errors import ConfigError, UsageError


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
        "stage": Option(1, "count", "1: optimizer state sharded; 2: gradients; 3: parameters")}

    def __init__(self, trainer: Any, comm: Any, **kwargs: Any):
        super().__init__(trainer, comm, **kwargs)
        if self.stage not in (1, 2, 3):
            raise ConfigError(f"scheme 'zero': stage {self.stage} is not built (stages 1, 2, 3)")
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
        self.buckets: Buckets | None = None
        self.param_bytes = sum(sizes)
        self.shapes = trainer.parameter_shapes()
        self.gathered = True  # whether every block is in the model (stage 3 frees the others')
        if self.stage == 3:
            self.tensors = _torch_parameters(trainer)
            self.params.views = None  # its views would keep the freed blocks' storage alive
        else:
            self.flat = np.empty(sum(self.counts), dtype=np.float32)

    def start(self) -> None:
        """Rank 0's parameters everywhere; stage 3 then frees the other ranks' blocks."""
        super().start()
        self._release()

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
             ) -> float:
        if self.stage == 3:
            return self._step3(feeds, lr, weight)
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

    def _step3(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float) -> float:
        """Gather the whole model, forward and backward, reduce-scatter the gradients, free the
        other blocks and the gradients, update this rank's block."""
        self._gather()
        loss, grads = self.gradients(feeds, weight)
        flat = np.concatenate([grads[n].reshape(-1) for n in self.names])
        del grads
        for t in self.tensors.values():  # the full gradient is freed: only the block is held
            t.grad = None
        vars(self.trainer).pop("_grad_views", None)  # the torch trainer's views of param.grad
        mine = self.comm.reduce_scatter(flat, self.counts, op="average")
        del flat
        self._release()
        self.held = self._storage()
        if self.state is not None:
            arrays = {n: self.tensors[n].detach().numpy() for n in self.mine}
            self.optimizer.step(arrays, self._unflatten(mine, self.mine), self.state, lr)
        self.steps += 1
        return loss

    def _storage(self) -> int:
        """Bytes of storage this rank's parameter tensors hold now (stage 3)."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors.values())

    def _gather(self) -> None:
        """Stage 3: every rank's block into this rank's model (storage allocated for the others)."""
        if self.gathered:
            return
        import torch
        mine = (np.concatenate([self.tensors[n].detach().numpy().reshape(-1) for n in self.mine])
                if self.mine else np.empty(0, np.float32))
        parts = self.comm.allgatherv(mine, self.counts) if self.size > 1 else [mine]
        for r, part in enumerate(parts):
            if r == self.rank:
                continue
            names = self.names[self.bounds[r]:self.bounds[r + 1]]
            for n, a in self._unflatten(part, names).items():
                self.tensors[n].data = torch.from_numpy(np.array(a))
        self.gathered = True

    def _release(self) -> None:
        """Stage 3: free the storage of every block but this rank's (size-0 tensors)."""
        if self.stage != 3 or not self.gathered or self.size == 1:
            return
        import torch
        mine = set(self.mine)
        for n in self.names:
            if n not in mine:
                self.tensors[n].data = torch.empty(0, dtype=torch.float32)
        self.gathered = False

    @contextlib.contextmanager
    def _evaluate(self) -> Iterator[None]:
        """Stage 3: the whole model gathered for the judge, freed again after."""
        freed = not self.gathered
        self._gather()
        try:
            yield
        finally:
            if freed:
                self._release()

    def _unflatten(self, flat: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        out, at = {}, 0
        for n in names:
            size = int(np.prod(self.shapes[n], dtype=np.int64))
            out[n] = flat[at:at + size].reshape(self.shapes[n])
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
        """The parameters are equal on every rank (stage 3: gathered, the whole model on every
        rank); the running statistics become rank 0's."""
        self._gather()
        self.broadcast_buffers(0)

    def saved(self) -> dict[str, np.ndarray]:
        """The step count and this rank's block's optimizer state (its trainer holds none)."""
        from d500.training.checkpoint import optimizer_arrays
        return {**super().saved(), **{f"block/{k}": v
                                      for k, v in optimizer_arrays(self.state).items()}}

    def restored(self, arrays: Mapping[str, np.ndarray]) -> None:
        from d500.training.checkpoint import set_optimizer_arrays
        super().restored(arrays)
        set_optimizer_arrays(self.state, {k[len("block/"):]: v for k, v in arrays.items()
                                          if k.startswith("block/")})

    def memory(self) -> dict[str, float]:
        """Bytes this rank holds across an update (module docstring)."""
        block = 4 * self.counts[self.rank]
        if self.stage == 3:  # measured at the end of the last step (finish gathers the model)
            held = self.held if self.steps else self._storage()
            return {"param_bytes": float(held),
                    "grad_bytes": float(block), "optimizer_bytes": float(state_bytes(self.state))}
        return {"param_bytes": float(self.param_bytes),
                "grad_bytes": float(self.param_bytes if self.stage == 1 else block),
                "optimizer_bytes": float(state_bytes(self.state))}

    def figures(self) -> dict[str, float]:
        out = {**self.memory(), "zero_stage": float(self.stage),
               "replicated_optimizer_bytes": float(self.replicated_state)}
        out["peak_param_bytes"] = float(self.param_bytes)  # the whole model, inside a step
        return out


def _torch_parameters(trainer: Any) -> dict[str, Any]:
    """The trainer's torch parameter tensors on CPU by name (stage 3 frees their storage); a
    UsageError for any other backend."""
    import torch
    params = getattr(trainer, "named", None)
    if not isinstance(params, dict) or not all(
            isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in params.values()):
        raise UsageError("shard: zero3 frees parameter storage through torch: it runs on the "
                         "torch backend on CPU only (--backend torch)")
    return params


def sizes_bytes(sizes: list[int], ranks: int) -> dict[int, int]:
    """Stage 3's parameter bytes held by each rank (rank -> bytes): its block of `blocks` over
    tensors of `sizes` bytes."""
    bounds = blocks(sizes, ranks)
    return {r: sum(sizes[bounds[r]:bounds[r + 1]]) for r in range(ranks)}


def shard_bytes(model: Any, spec: Any, world: int) -> dict[int, int]:
    """Stage 3's parameter bytes per rank (rank -> bytes) of the ONNX `model` at `world` ranks
    (the judge's check of the ranks' memory claims): its float initializers less the running
    statistics, in graph order (the trainers' parameters, as Trainer names them)."""
    import onnx

    from d500.backends.training_graph import training_graph
    buffers = training_graph(model).updates
    sizes = [onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer
             if onnx.helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"
             and t.name not in buffers]
    return sizes_bytes(sizes, spec.dims(world)["data"])
