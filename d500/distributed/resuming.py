"""Checkpoints of a level-3 run: which entries can be checkpointed exactly, and every rank's state
gathered to rank 0 for the judge's one file (and scattered back when the run is resumed).

    resuming.check(spec, entry, backend)     # every rank, before anything is recorded
    every = resuming.gather(control, resuming.capture(scheme, step))   # rank 0: all ranks'
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
"""

from __future__ import annotations

from typing import Any

from d500.errors import UsageError

# what is not checkpointed yet, and why (the schemes say their own: Scheme.unresumable)
NOT_YET = {
    "pipeline": "a pipeline's stages are not checkpointed yet",
    "tensor": "tensor-parallel shards are not checkpointed yet",
    "zero3": "ZeRO-3's freed parameter blocks are not checkpointed yet",
    "native": "torch's own distributed wrappers' state is not checkpointed yet",
}


def refusal(spec: Any) -> str:
    """Why a run of `spec` (d500.distributed.spec.Spec) cannot be checkpointed and continued
    exactly ("" when it can)."""
    from d500.distributed.schemes import SCHEMES
    if spec.native:
        return f"scheme '{spec.scheme}': {NOT_YET['native']}"
    for dimension in ("pipeline", "tensor"):
        if getattr(spec, dimension) > 1:
            return NOT_YET[dimension]
    if spec.shard == "zero3":
        return NOT_YET["zero3"]
    why = SCHEMES[spec.scheme].unresumable
    return f"scheme '{spec.scheme}': {why}" if why else ""


def check(spec: Any, entry: Any, backend: str) -> None:
    """A UsageError naming the entry's file when its runs cannot checkpoint (the same on every
    rank: the ranks agreed on the files)."""
    from d500.training import checkpoint
    why = refusal(spec)
    if why:
        raise UsageError(f"{entry.path}: --checkpoint-every and --resume: {why}")
    if entry.recipe.native:
        checkpoint.supported(backend, entry.recipe.native)


def capture(scheme: Any, step: int) -> dict[str, Any]:
    """This rank's state after `step` steps (every rank at the same step, after `settle`)."""
    from d500.training import checkpoint
    return {**checkpoint.capture(scheme.trainer, step), "scheme": scheme.saved()}


def restore(scheme: Any, state: dict[str, Any]) -> int:
    """Put a rank's captured state back into its trainer, RNGs and scheme; its step count."""
    from d500.training import checkpoint
    step = checkpoint.restore(scheme.trainer, state)
    scheme.restored(state["scheme"])
    return step


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
    world size is refused before: d500.training.resume.plan)."""
    if control is None:
        return every
    shares = None
    if control.Get_rank() == 0:
        ranks = every["ranks"]
        shares = [every] + [ranks[r] for r in range(1, control.Get_size())]
    return control.scatter(shares, root=0)
