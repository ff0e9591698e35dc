"""Checkpoints of a level-3 run: which entries can be checkpointed exactly, and every rank's state
gathered to rank 0 for the judge's one file (and scattered back when the run is resumed).

    resuming.check(spec, entry, backend, workload)   # every rank, before anything is recorded
    every = resuming.gather(control, resuming.capture(scheme, step))   # rank 0: all ranks'
    resuming.fits(spec, world, resumed)              # rank 0, --resume: the file's grid is ours
    step = resuming.restore(scheme, resuming.scatter(control, every))  # each rank its own

One file, not one per rank: the judge writes it (write then rename) and seals one sha256 in the
ledger, so a checkpoint is every rank's state at one step or nothing, and no rank's file can be
swapped for another step's. The cost: each checkpoint passes W models (and W optimizer states)
through rank 0 and the judge's pipe, fine at the sizes level 3 trains here. A rank's state is
level 2's (d500.training.checkpoint.capture: its model, its optimizer's slots, its RNGs) and its
scheme's own (`Scheme.saved`: its step count, its compressor's error-feedback residuals and
state, a ZeRO rank's block of optimizer state); the
sampler's position is the epoch (PartitionedSampler.shares is a function of seed, epoch and
rank), and the clock's reading is the judge's (d500.training.resume).

Where ranks hold parts of the model, a rank's state is its own piece: a pipeline rank's stage
(its trainer holds only the stage's parameters and their optimizer state), a tensor rank's shards
(its segments' trainers, d500.distributed.tensor.rank.Shards), a ZeRO-3 rank's rows and their
optimizer state (d500.distributed.schemes.zero3.Rows). Every piece carries its grid coordinates
(`scheme/grid/<dimension>`) and the file the grid's dimensions (`grid` in its header, written by
the judge): a resume is refused unless the grid is this run's and each piece's coordinates are
those of the rank it goes to, and a rank refuses a piece whose arrays are not its own part's
(names and shapes), so a resume gives each rank back exactly its piece. Pieces of equal shapes
swapped with their tags (tensor shards: hidden units permuted; ZeRO-3: rows) pass those checks,
so the judge also seals in the ledger (not in the file) a digest of what it saw at the
checkpoint (`digest`: the whole model, each rank's piece and optimizer state), and after a resume
the ranks hand the same over once before the first step: a mismatch is `Refused` on every rank.
"""

from __future__ import annotations

import hashlib
from typing import Any

from d500.distributed.grid import ORDER, coordinates
from d500.errors import D500Error, UsageError

# what is not checkpointed yet, and why (the schemes say their own: Scheme.unresumable)
NOT_YET = {
    "native": "torch's own distributed wrappers' state is not checkpointed yet (it lives in "
              "torch's process groups and wrappers, which d500's checkpoint does not read)",
    # (a baseline not in NATIVE; those in it are: their trainer, local shards or stage)
    "zero3-whole": "ZeRO-3 of a model with running statistics (the whole-model gather, "
                   "d500.distributed.schemes.zero) is not checkpointed yet",
}
NATIVE = ("ddp", "fsdp", "dtensor", "pipelining")  # the native baselines checkpointed: ddp's
# trainer (the whole model, as sync's), the others' shards (d500.distributed.fsdp.Shards) or stage
PIECES = ("pipeline", "tensor", "zero3",  # the schemes whose ranks each hold a piece
          "fsdp", "dtensor", "pipelining")
GRID = "grid/"  # a piece's coordinates among its scheme's arrays: grid/data, grid/pipeline, ...
SEEN = ("model", "optimizer")  # each rank's parts in the judge's digest (beside the whole model)


class Refused(UsageError):
    """The judge refused a resumed run: told to every rank at once, which end it together."""


def refusal(spec: Any, model: Any = None) -> str:
    """Why a run of `spec` (d500.distributed.spec.Spec) on the ONNX `model` (None: not known)
    cannot be checkpointed and continued exactly ("" when it can)."""
    from d500.distributed.schemes import SCHEMES
    if spec.native and spec.scheme not in NATIVE:
        return f"scheme '{spec.scheme}': {NOT_YET['native']}"
    if spec.shard == "zero3" and model is not None:
        from d500.backends.training_graph import running_statistics
        if running_statistics(model):
            return NOT_YET["zero3-whole"]
    why = getattr(SCHEMES.get(spec.scheme), "unresumable", "")  # (a native one: none)
    return f"scheme '{spec.scheme}': {why}" if why else ""


def check(spec: Any, entry: Any, backend: str, workload: Any = None) -> None:
    """A UsageError naming the entry's file when its runs cannot checkpoint (the same on every
    rank: the ranks agreed on the files)."""
    from d500.training import checkpoint
    model = None
    if spec.shard == "zero3" and workload is not None:  # which ZeRO-3 runs depends on the model
        from d500.training.data import dataset as datasets
        model = workload.build_model(0, *datasets.shape_of(workload.dataset))
    why = refusal(spec, model)
    if why:
        raise UsageError(f"{entry.path}: --checkpoint-every and --resume: {why}")
    if entry.recipe.native:
        checkpoint.supported(backend, entry.recipe.native)


def pieced(scheme: Any) -> bool:
    """Whether this rank holds a piece of the model, not all of it (rank 0 then also hands the
    whole model, gathered as for an evaluation, for the judge to check at a checkpoint)."""
    return scheme.name in PIECES


def coords(scheme: Any) -> dict[str, int]:
    """This rank's grid coordinates: its scheme's grid's (pipeline, tensor), a native
    baseline's rank in the one dimension it spans, else the data dimension's rank (every other
    dimension one rank)."""
    grid = getattr(scheme, "grid", None)
    if grid is not None:
        return dict(grid.coords)
    own = getattr(scheme, "dimension", None)  # (its comm is the data dimension's: one rank)
    if own is not None:
        return {**dict.fromkeys(ORDER, 0), own: scheme.world.rank}
    return {**dict.fromkeys(ORDER, 0), "data": scheme.comm.rank}


def capture(scheme: Any, step: int) -> dict[str, Any]:
    """This rank's state after `step` steps (every rank at the same step, after `settle`), its
    grid coordinates with it."""
    import numpy as np

    from d500.training import checkpoint
    where = {f"{GRID}{k}": np.asarray(v, np.int64) for k, v in coords(scheme).items()}
    return {**checkpoint.capture(_part(scheme), step), "scheme": {**scheme.saved(), **where}}


def _part(scheme: Any) -> Any:
    """What a checkpoint reads and writes of this rank: its scheme's `piece` (a native
    baseline's local shards), else its trainer."""
    return getattr(scheme, "piece", None) or scheme.trainer


def restore(scheme: Any, state: dict[str, Any]) -> int:
    """Put a rank's captured state back into its trainer, RNGs and scheme; its step count (a
    D500Error when the piece is not this rank's: another coordinate's, or another part)."""
    from d500.training import checkpoint
    mine = coords(scheme)
    theirs = _coords(state, mine["data"])
    if theirs != mine:
        raise D500Error(f"the checkpoint's piece sent to the rank at {_shown(mine)} is the "
                        f"piece of {_shown(theirs)}")
    _fits_part(checkpoint.capture(_part(scheme), 0), state, mine)
    step = checkpoint.restore(_part(scheme), state)
    scheme.restored(state["scheme"])
    return step


def fits(spec: Any, world: int, resumed: Any) -> None:
    """A UsageError unless the checkpoint of `resumed` (d500.training.resume.Resumed) was taken
    on this run's grid (`spec`'s dimensions at `world` ranks), with rank R's piece from the rank
    at R's coordinates (a checkpoint from before pieces carried coordinates: the data-parallel
    grid, every rank its data coordinate)."""
    state, meta = resumed.state, resumed.meta
    where = f"--resume {resumed.parent}: {resumed.path}"
    dims = spec.dims(world)
    grid = meta.get("grid", {**dict.fromkeys(ORDER, 1), "data": meta.get("world_size")})
    if grid != dims:
        raise UsageError(f"{where} was taken on the grid {_shown(grid, 'x')}, not this run's "
                         f"{_shown(dims, 'x')}: resume it with the same dimensions")
    pieces = {0: state, **state.get("ranks", {})}
    for r in range(world):
        if r not in pieces:
            raise UsageError(f"{where} holds no piece for rank {r}")
        want, got = coordinates(r, dims), _coords(pieces[r], r)
        if got != want:
            raise UsageError(f"{where}: the piece for rank {r} ({_shown(want)}) is the piece "
                             f"of {_shown(got)}")


def _coords(state: dict[str, Any], rank: int) -> dict[str, int]:
    """A piece's grid coordinates (one from before pieces carried them, when every run
    checkpointed was data parallel: data = `rank`)."""
    arrays = state.get("scheme", {})
    if not any(k.startswith(GRID) for k in arrays):
        return {**dict.fromkeys(ORDER, 0), "data": rank}
    return {k: int(arrays[GRID + k]) if GRID + k in arrays else -1 for k in ORDER}


def _shown(where: dict[str, Any], sep: str = ", ") -> str:
    if sep == "x":
        return " x ".join(f"{k} {where.get(k)}" for k in ("data", "pipeline", "tensor"))
    return sep.join(f"{k} {where.get(k)}" for k in ORDER)


def _fits_part(own: dict[str, Any], state: dict[str, Any], where: dict[str, int]) -> None:
    """A D500Error unless the piece's model and optimizer arrays have this rank's names and
    shapes (`own`: this rank's state, captured now)."""
    for part in ("model", "optimizer"):
        mine, theirs = own[part], state.get(part, {})
        for name in sorted(set(mine) | set(theirs)):
            a, b = mine.get(name), theirs.get(name)
            if a is None or b is None or a.shape != b.shape:
                there = "absent" if b is None else f"of shape {tuple(b.shape)}"
                here = "absent" if a is None else f"of shape {tuple(a.shape)}"
                raise D500Error(f"the checkpoint's piece for the rank at {_shown(where)} is not "
                                f"its part: {part} '{name}' is {there} there, {here} here")


def digest(every: dict[str, Any]) -> str:
    """The sha256 of what the judge sees at a checkpoint of ranks holding pieces (`gather`'s
    result with the gathered "whole" model): the whole model, then each rank's model and optimizer
    arrays in rank order, every array by name, dtype, shape and bytes."""
    import numpy as np
    ranks = every.get("ranks", {})
    parts = [("whole", every["whole"])] + [
        (f"rank{r}/{part}", (every if r == 0 else ranks[r])[part])
        for r in range(1 + len(ranks)) for part in SEEN]
    h = hashlib.sha256()
    for label, arrays in parts:
        for name in sorted(arrays):
            a = np.ascontiguousarray(arrays[name])
            h.update(f"{label}/{name} {a.dtype.str} {a.shape}\n".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def verify(resumed: Any, seen: dict[str, Any] | None) -> None:
    """Refused unless what the ranks hand over after restoring `resumed`'s checkpoint
    (d500.training.resume.Resumed) has the digest the judge sealed when it was taken."""
    where = f"--resume {resumed.parent}: {resumed.path}"
    if resumed.whole is None:
        raise Refused(f"{where}: the ledger holds no digest of the model the judge saw at this "
                      f"checkpoint, so its pieces cannot be checked: it cannot be resumed")
    if seen is None or digest(seen) != resumed.whole:
        raise Refused(f"{where}: its pieces restore another model than the judge saw at this "
                      f"checkpoint (pieces swapped or edited): it cannot be resumed")


def gather(control: Any, own: dict[str, Any]) -> dict[str, Any] | None:
    """Every rank's state on rank 0: rank 0's, with the others' under "ranks" (None elsewhere;
    `control`: the run's own communicator, None at one rank)."""
    if control is None:
        return {**own, "ranks": {}}
    every = control.gather(own, root=0)
    if control.Get_rank() != 0:
        return None
    return {**every[0], "ranks": {r: state for r, state in enumerate(every) if r}}


def scatter(control: Any, every: dict[str, Any] | None) -> dict[str, Any]:
    """Each rank's own state from what `gather` returned on rank 0 (a checkpoint of another
    world size or grid is refused before: d500.training.resume.plan, `fits`)."""
    if control is None:
        return every
    shares = None
    if control.Get_rank() == 0:
        ranks = every["ranks"]
        shares = [every] + [ranks[r] for r in range(1, control.Get_size())]
    return control.scatter(shares, root=0)
