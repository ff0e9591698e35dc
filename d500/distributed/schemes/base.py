"""The Scheme interface of level 3: a distributed optimizer wrapping one rank's level-2 Trainer and
a Communicator, its validated options, and the registry (`SCHEMES`, `make`).

    scheme = make("sync", trainer, comm, reducer=None, bucket_bytes=25 * 2**20)
    scheme.start()                      # every rank from rank 0's parameters
    for feeds, weight in my_share_of_each_global_batch:
        loss = scheme.step(feeds, lr, weight)   # this rank's loss
    with scheme.evaluated():            # on every rank at the same step: the scheme's model
        accuracy = evaluate(trainer)
    scheme.settle()                     # on every rank before a collective of the caller's own
    scheme.finish()                     # on every rank after the last step: the final model
    scheme.figures()                    # scheme-specific figures, floats

`weight` is the share's size x the data ranks / the global batch's size (1 where the ranks'
shares are equal; PartitionedSampler.shares gives it): `gradients` scales this rank's mean
gradient by it, so that the schemes' equal-weight average over ranks is the global batch's mean
gradient, not the mean of the shares' means (which is SGD on another loss when N does not
divide the batch).

Every method but `figures`/`details`/`memory` is collective: every rank calls it the same
number of times in the same order. Between `step` calls a scheme may leave messages in flight
(async_ps does), so the caller runs its own collectives (on `comm` or on MPI directly) only
inside `evaluated()`, after `settle()` or after `finish()`. Traffic counted on `comm` inside
`evaluated()` is moved to `comm.traffic["evaluate"]`, and what `finish()` sends to hand every
rank the final model to `comm.traffic["finish"]`, so the other names hold training traffic only
(the per-step figures).

Batch normalisation's running statistics (the trainer's `buffer_names`) are per rank: each rank
normalises with the batch statistics of its own share and updates its own running statistics, as
torch DDP without SyncBatchNorm (and without forward buffer syncing) does. They belong to the
model, not to the gradient: what schemes exchange as gradients (sync's allreduce, ps's reduce,
async_ps's pushes) never carries them; whenever a scheme moves whole models they travel with the
parameters (`Parameters` holds both): broadcast (`start`, ps after every step, async_ps at
evaluations and finish: rank 0's) or averaged (local_sgd every period, dpsgd's mixing, the
averaged model evaluated and finished: the mean of the ranks' means and of their variances, the
spread of the ranks' means left out). Sync never moves the model after `start`: rank 0 evaluates
with its own statistics and `finish` broadcasts them. B in the schemes' byte counts is the model's
bytes (parameters and running statistics) where models travel, the parameters' where gradients do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from d500.distributed.buckets import DEFAULT_BUCKET_BYTES, Buckets
from d500.distributed.comm import Communicator, Traffic
from d500.errors import ConfigError, UsageError

EVALUATE = "evaluate"  # the traffic name of everything counted inside evaluated()
FINISH = "finish"  # ... and of what finish() sends to give every rank the final model


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a scheme: its default, its kind ('bool', 'count' = whole number >= 1,
    'whole' = whole number >= 0) and what it does."""

    default: Any
    kind: str
    help: str = ""


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "a whole number >= 1"),
    "whole": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "a whole number >= 0"),
}


class Scheme:
    """A distributed optimizer over `comm` wrapping this rank's level-2 `trainer` (see the
    module docstring for the calls). Subclasses set `name`, `options`, `compressible` and write
    `step` (and `_evaluate`, `figures`, `finish` where they differ)."""

    name: ClassVar[str] = ""
    options: ClassVar[dict[str, Option]] = {}
    compressible: ClassVar[bool] = False  # accepts a CompressedReducer
    holds_loss: bool = True  # step() returns this rank's loss (a pipeline's last stage only)
    # why a checkpoint cannot restore this scheme exactly ("": it can, d500.distributed.resuming)
    unresumable: ClassVar[str] = ""

    @classmethod
    def checked_options(cls, options: dict[str, Any], where: str) -> dict[str, Any]:
        """Every option's value, its default where not given; a ConfigError starting with
        `where` for an unknown option or a value not of its kind (d500.distributed.spec checks
        an entry's when it reads the file, before any rank trains)."""
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            known = ", ".join(cls.options) or "none"
            raise ConfigError(f"{where}: unknown option '{unknown[0]}' (options: {known})")
        values = {}
        for key, spec in cls.options.items():
            value = options.get(key, spec.default)
            test, meaning = _KINDS[spec.kind]
            if not test(value):
                raise ConfigError(f"{where}: option '{key}' must be {meaning}, got {value!r}")
            values[key] = value
        return values

    def __init__(self, trainer: Any, comm: Communicator, *, reducer: Any = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, **options: Any):
        where = f"scheme '{self.name}'"
        for key, value in self.checked_options(options, where).items():
            setattr(self, key, value)
        if reducer is not None and not self.compressible:
            able = ", ".join(n for n, c in SCHEMES.items() if c.compressible)
            raise ConfigError(f"{where} does not compress gradients (compression works with: "
                              f"{able}); remove the compressor or choose one of those schemes")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) \
                or bucket_bytes < 1:
            raise ConfigError(f"{where}: bucket_bytes must be a whole number of bytes >= 1, "
                              f"got {bucket_bytes!r}")
        self.trainer, self.comm, self.reducer = trainer, comm, reducer
        self.bucket_bytes = bucket_bytes
        self.rank, self.size = comm.rank, comm.size
        self.steps = 0  # step() calls on this rank
        self.params = Parameters(trainer)
        self.consensus_distance = math.nan  # at the last averaged_model() (dpsgd, local_sgd)
        self._param_buckets: Buckets | None = None

    # ------------------------------------------------------------------ the interface
    def start(self) -> None:
        """Every rank's parameters become rank 0's (one fused broadcast)."""
        self.broadcast_parameters()

    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        """One distributed step on this rank's share `feeds` of the global batch at learning
        rate `lr`, its gradient weighted by `weight` (module docstring); this rank's loss."""
        raise NotImplementedError

    def gradients(self, feeds: Mapping[str, np.ndarray], weight: float = 1.0
                  ) -> tuple[float, dict[str, np.ndarray]]:
        """The trainer's (loss, gradients) of `feeds`, the gradients scaled by `weight` in
        place (the loss is the share's own)."""
        loss, grads = self.trainer.gradients(feeds)
        if weight != 1.0:
            for g in grads.values():
                g *= np.asarray(weight, dtype=g.dtype)
        return loss, grads

    def local_step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0
                   ) -> float:
        """This rank's own update from its weighted gradient (the trainer's fused `step` where
        the weight is 1); its loss."""
        if weight == 1.0:
            return self.trainer.step(feeds, lr)
        loss, grads = self.gradients(feeds, weight)
        self.trainer.apply(grads, lr)
        return loss

    @contextlib.contextmanager
    def evaluated(self) -> Iterator[None]:
        """Inside, this rank's model is the scheme's result (restored after where it differs);
        the traffic it costs is counted under `comm.traffic["evaluate"]` (what `settle`
        completes of training first is not)."""
        self.settle()
        before = self._traffic()
        try:
            with self._evaluate():
                yield
        finally:
            for comm, then in before:
                _move_traffic(comm, then, EVALUATE)

    def finish(self) -> None:
        """After the last step, on every rank: complete the training traffic in flight
        (`settle`), then leave every rank with the scheme's final model (`_finish`: the
        average of the models for dpsgd and local_sgd, the server's for async_ps), counted
        under `comm.traffic["finish"]`."""
        self.settle()
        before = self._traffic()
        try:
            self._finish()
        finally:
            for comm, then in before:
                _move_traffic(comm, then, FINISH)

    def handed(self) -> dict[str, np.ndarray]:
        """Inside `evaluated()`, on rank 0: the model it hands to the judge, parameters and
        running statistics by name, as copies (a pipeline's: every stage's, gathered)."""
        return model_state(self.trainer)

    def saved(self) -> dict[str, np.ndarray]:
        """This rank's state beyond its trainer's, for a checkpoint (after `settle`): its step
        count (local_sgd averages by it) and its reducer's error-feedback residuals and
        compressor state (step counters, PowerSGD's Q), by array name."""
        out = {"steps": np.asarray(self.steps, np.int64)}
        if self.reducer is not None:
            for part in ("memory", "compressor"):
                out.update({f"{part}/{k}": v
                            for k, v in getattr(self.reducer, part).saved().items()})
        return out

    def restored(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Put back what `saved` returned (after `start`)."""
        self.steps = int(arrays["steps"])
        if self.reducer is not None:
            for part in ("memory", "compressor"):
                getattr(self.reducer, part).restored(
                    {k[len(part) + 1:]: v for k, v in arrays.items() if k.startswith(part + "/")})

    def figures(self) -> dict[str, float]:
        """Scheme-specific figures of this rank (e.g. staleness, compression ratio)."""
        return self.compression_figures()

    def details(self) -> dict[str, Any]:
        """Scheme-specific data that is not one number (e.g. a histogram), JSON-ready."""
        return {}

    # ------------------------------------------------------------------ for subclasses
    communicators: tuple[str, ...] = ("comm",)  # attributes whose traffic evaluated() sorts

    def counted(self) -> list[Communicator]:
        """The scheme's communicators, each once (a pipeline's: its data and pipeline ones)."""
        return list({id(c): c for c in (getattr(self, a) for a in self.communicators)}.values())

    def _traffic(self) -> list[tuple[Communicator, dict[str, Traffic]]]:
        """A copy of the traffic counted so far on each of the scheme's communicators."""
        return [(c, {k: dataclasses.replace(t) for k, t in c.traffic.items()})
                for c in self.counted()]

    def settle(self) -> None:
        """On every rank at the same step: complete the training traffic still in flight, so
        that a collective of the caller's own can follow (default: there is none). Call it
        before any collective between steps outside `evaluated()` (which calls it first) and
        `finish()` (likewise): async_ps would otherwise deadlock there."""

    def _finish(self) -> None:
        """Make every rank's model the scheme's final one (default: it already is)."""

    @contextlib.contextmanager
    def _evaluate(self) -> Iterator[None]:
        """The model is already the scheme's result on every rank (sync, ps)."""
        yield

    def broadcast_parameters(self, root: int = 0) -> None:
        """Rank `root`'s parameters into every rank's model, fused into buckets."""
        arrays = self.params.get()
        if self._param_buckets is None:
            self._param_buckets = Buckets(arrays, self.bucket_bytes)
        self._param_buckets.apply(arrays, lambda buf: self.comm.broadcast(buf, root))
        self.params.put(arrays)

    def broadcast_buffers(self, root: int = 0) -> None:
        """Rank `root`'s running statistics into every rank's model (one fused broadcast; none
        for a model without them)."""
        if self.params.buffer_names and self.size > 1:
            arrays = self.trainer.buffers()
            Buckets(arrays, self.bucket_bytes).apply(
                arrays, lambda buf: self.comm.broadcast(buf, root))
            self.trainer.set_buffers(arrays)

    def average_parameters(self) -> None:
        """Every rank's model becomes the average of all ranks' models (fused allreduce)."""
        arrays = self.params.get()
        if self._param_buckets is None:
            self._param_buckets = Buckets(arrays, self.bucket_bytes)
        self._param_buckets.allreduce(arrays, self.comm, op="average")
        self.params.put(arrays)

    @contextlib.contextmanager
    def averaged_model(self) -> Iterator[None]:
        """Inside, every rank holds the average of the ranks' models; its own after. Sets
        `consensus_distance`: ||own - average|| / ||average|| of this rank's model."""
        own = {n: np.array(a) for n, a in self.params.get().items()}
        self.average_parameters()
        average = self.params.get()
        names = [n for n in own if n not in self.params.buffer_names]  # parameters only
        self.consensus_distance = float(np.sqrt(
            sum(np.sum((own[k].astype(np.float64) - average[k]) ** 2) for k in names)
            / max(sum(np.sum(average[k].astype(np.float64) ** 2) for k in names), 1e-300)))
        try:
            yield
        finally:
            self.params.put(own)

    def memory(self) -> dict[str, float]:
        """Bytes this rank holds across a step's update: its parameters, a whole gradient (every
        data-parallel scheme computes and keeps one) and its optimizer's state as allocated
        (ps's ranks but 0 allocate one too; it is counted where it exists)."""
        arrays = self.params.get()
        p = float(sum(a.nbytes for n, a in arrays.items()
                      if n not in set(self.params.buffer_names)))
        return {"param_bytes": p, "grad_bytes": p,
                "optimizer_bytes": float(state_bytes(getattr(self.trainer, "state", None)))}

    def compression_figures(self) -> dict[str, float]:
        """The reducer's payload bytes per step and compression ratio (dense / sent), if any."""
        r = self.reducer
        if r is None or not r.steps:
            return {}
        return {"payload_bytes_per_step": r.sent_bytes / r.steps,
                "compression_ratio": r.dense_bytes / r.sent_bytes if r.sent_bytes else 0.0}


class Parameters:
    """This rank's model as writable NumPy arrays: its parameters, the trainer's zero-copy views
    where it has them (torch on CPU: `get` costs nothing, `put` nothing), else copies written
    back by `put` through `set_parameters`; then its running statistics (`buffer_names`, copies
    written back through `set_buffers`), if it has any."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.views = trainer.parameter_views()
        self.buffer_names: list[str] = list(getattr(trainer, "buffer_names", ()))

    def get(self) -> dict[str, np.ndarray]:
        if self.views is not None:
            arrays = self.views
        else:
            arrays = {n: a if a.flags.writeable else np.array(a)
                      for n, a in self.trainer.parameters().items()}
        if not self.buffer_names:
            return arrays
        return {**arrays, **self.trainer.buffers()}

    def put(self, arrays: Mapping[str, np.ndarray]) -> None:
        if self.buffer_names:
            self.trainer.set_buffers({n: arrays[n] for n in self.buffer_names})
            if self.views is not None and all(arrays[n] is v for n, v in self.views.items()):
                return
            arrays = {n: a for n, a in arrays.items() if n not in set(self.buffer_names)}
        if arrays is not self.views:
            self.trainer.set_parameters(arrays)


def model_state(trainer: Any) -> dict[str, np.ndarray]:
    """A trainer's parameters and running statistics by name, as copies."""
    return {n: np.array(v, copy=True)
            for n, v in {**trainer.parameters(), **trainer.buffers()}.items()}


def state_bytes(state: Any) -> int:
    """Bytes of an optimizer State's slots (every tensor in them, any framework; 0 for None)."""
    if state is None:
        return 0
    total = 0
    for slot in state.slots.values():
        for t in slot if isinstance(slot, (list, tuple)) else [slot]:
            n = getattr(t, "nbytes", None)
            total += n if isinstance(n, int) else np.asarray(t).nbytes
    return total


def _move_traffic(comm: Communicator, before: dict[str, Traffic], into: str) -> None:
    """Move what `comm` counted since `before` (a copy of its traffic) to `traffic[into]`."""
    moved = comm.traffic.get(into) or Traffic()
    for name in list(comm.traffic):
        if name == into:
            continue
        now, then = comm.traffic[name], before.get(name, Traffic())
        moved.calls += now.calls - then.calls
        moved.sent += now.sent - then.sent
        moved.received += now.received - then.received
        moved.seconds += now.seconds - then.seconds
        if name in before:  # the same object, set back (holders of it see training only)
            now.calls, now.sent, now.received, now.seconds = (
                then.calls, then.sent, then.received, then.seconds)
        else:
            del comm.traffic[name]
    if moved.calls:
        comm.traffic[into] = moved


def make_reducer(comm: Communicator, compressor: str, params: Mapping[str, Any] | None = None,
                 *, seed: int = 0, where: str = "compression") -> Any:
    """A CompressedReducer over `comm`'s allreduce and allgather for the compressor named
    `compressor` with hyperparameters `params` (`seed` the same on every rank)."""
    from d500.distributed.compression import CompressedReducer
    from d500.distributed.compression import make as make_compressor
    c, memory = make_compressor(compressor, params, seed=seed, worker=comm.rank, where=where)
    return CompressedReducer(c, memory, allreduce=comm.allreduce, allgather=comm.allgather,
                             world=comm.size)


def make(name: str, trainer: Any, comm: Communicator, **options: Any) -> Scheme:
    """The scheme `name` over `trainer` and `comm` (options as Scheme.__init__ takes them)."""
    if name not in SCHEMES:
        raise UsageError(f"unknown scheme '{name}' (known: {', '.join(SCHEMES)})")
    return SCHEMES[name](trainer, comm, **options)


SCHEMES: dict[str, type[Scheme]] = {}  # filled by d500.distributed.schemes


def register(cls: type[Scheme]) -> type[Scheme]:
    """Add a scheme class to SCHEMES under its name."""
    SCHEMES[cls.name] = cls
    return cls
