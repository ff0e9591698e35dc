"""Tensor parallelism inside pipeline stages on real MPI ranks, run by test_tensor_pipeline_mpi.py
as `mpiexec -n 4 python mpi_tensor_pipeline_checks.py` (mpi_scheme_checks.main: one JSON line per
check passed): a 2-layer transformer language model (its embedding tied to its output as
text-lm's is: held by both stages, its gradient summed over them) cut into 2 stages (one layer
each), each stage split over 2 tensor ranks ({pipeline: 2, tensor: 2}), trained STEPS steps
with momentum in 2 micro-batches (1F1B), gives one process's losses within 1e-5 relative and,
gathered to rank 0 as the judge receives it, one process's parameters; the memory each rank
reports is below what the same model's ranks report at {data: 2, pipeline: 2} and at
{data: 2, tensor: 2}; a checkpoint of the composition restored into other ranks continues bit
for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_scheme_checks import CHECKS, check, main  # noqa: E402
from mpi_tensor_checks import agrees  # noqa: E402

from d500 import backends  # noqa: E402
from d500.builders import build_lm  # noqa: E402
from d500.distributed.comm import Communicator  # noqa: E402
from d500.distributed.figures import MEMORY  # noqa: E402
from d500.distributed.grid import Grid  # noqa: E402
from d500.distributed.pipeline.scheme import build as pipeline  # noqa: E402
from d500.distributed.spec import parse  # noqa: E402
from d500.distributed.tensor.scheme import build as tensor  # noqa: E402
from d500.training.optimizers.registry import make as make_optimizer  # noqa: E402

CHECKS.clear()  # this file's checks only
STEPS = 6
LR = 0.1
CONTEXT, VOCAB = 8, 16


def model(tied: bool = True):
    return build_lm("transformer", CONTEXT, VOCAB, seed=3, loss=True, layers=2, width=16,
                    heads=2, tied=tied)


def batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, (STEPS, 8, CONTEXT + 1))
    return [{"input": t[:, :-1], "labels": t[:, 1:]} for t in tokens]


def optimizer():
    return make_optimizer("momentum", lr=LR, momentum=0.9)


def trained(c: Communicator, onnx_model, distributed: dict):
    """(the scheme, the global batch's loss at each step on every rank) after STEPS steps."""
    spec = parse({"scheme": "sync", **distributed}, "composed.yaml")
    grid = Grid(c, spec.dims(c.size))
    build = pipeline if spec.pipeline > 1 else tensor
    scheme = build(onnx_model, spec, grid, backends.get("torch"), optimizer(), False)
    scheme.start()
    d, n = grid.coords["data"], grid.sizes["data"]  # each data rank its equal share
    losses = [scheme.step({k: v[d * len(v) // n:(d + 1) * len(v) // n] for k, v in b.items()},
                          LR) for b in batches()]
    # the global batch's loss: the holders' (a pipeline's last stage) mean over the data ranks
    holders = c.mpi.allreduce(1.0 if getattr(scheme, "holds_loss", True) else 0.0)
    losses = list(c.mpi.allreduce(np.array(losses)) / holders)
    return scheme, losses


def held(c: Communicator, scheme) -> float:
    """The most bytes any rank says it holds (the judge's memory_per_rank)."""
    mine = scheme.memory()
    return c.mpi.allreduce(sum(mine[k] for k in MEMORY), op=MPI.MAX)


@check
def tensor_inside_pipeline_equals_one_process_and_holds_less(c: Communicator) -> dict:
    onnx_model = model()
    one = backends.get("torch").prepare(onnx_model).trainer(optimizer())
    reference = [one.step(b, LR) for b in batches()]
    scheme, losses = trained(c, onnx_model, {"pipeline": 2, "tensor": 2, "micro_batches": 2,
                                             "schedule": "1f1b"})
    with scheme.evaluated():
        state = scheme.handed() if c.rank == 0 else None
    out = agrees(c, losses, reference, state, one)
    out.update(tensor_bytes=scheme.tp.traffic["allreduce"].sent,
               pipeline_bytes=scheme.pipe.traffic["send"].sent,
               bubble_measured=scheme.figures()["bubble_measured"])
    out["memory_per_rank"] = held(c, scheme)
    for name, dims in (("pipeline_only", {"data": 2, "pipeline": 2, "micro_batches": 2}),
                       ("tensor_only", {"data": 2, "tensor": 2})):
        other, theirs = trained(c, onnx_model, dims)
        assert max(abs(a - b) / abs(b) for a, b in zip(theirs, reference)) < 1e-5, name
        out[f"{name}_memory_per_rank"] = held(c, other)
        assert out["memory_per_rank"] < out[f"{name}_memory_per_rank"], out
    return out


@check
def tensor_inside_pipeline_checkpoint_continues_bit_for_bit(c: Communicator) -> dict:
    """A checkpoint of the composition (each rank its split stage's shards, tagged with its
    pipeline and tensor coordinates) through the judge's file, restored into ranks built from
    another seed, continues as the saved ranks do, bit for bit; what the ranks hand the judge
    after the restore has the digest it sealed (d500.distributed.resuming)."""
    from d500.distributed import resuming
    from d500.distributed.pipeline.scheme import build as pipeline
    from d500.training import checkpoint
    spec = parse({"scheme": "sync", "pipeline": 2, "tensor": 2, "micro_batches": 2,
                  "schedule": "1f1b"}, "composed.yaml")

    def made(seed: int):
        m = build_lm("transformer", CONTEXT, VOCAB, seed=seed, loss=True, layers=2, width=16,
                     heads=2, tied=True)
        s = pipeline(m, spec, Grid(c, spec.dims(c.size)), backends.get("torch"), optimizer(),
                     False)
        s.start()
        return s

    def seen(s):  # as the run's loop hands it over (RankLoop._seen)
        every = resuming.gather(c.mpi, resuming.capture(s, 3))
        with s.evaluated():
            whole = s.handed() if c.rank == 0 else None
        return None if every is None else {**every, "whole": whole}

    b = batches()
    saved = made(3)
    for f in b[:3]:
        saved.step(f, LR)
    every, state = seen(saved), None
    if c.rank == 0:
        import tempfile
        from pathlib import Path
        path, sha = checkpoint.write(Path(tempfile.mkdtemp()), 1, every, {"world_size": 4})
        state, _ = checkpoint.read(path, sha)
    restored = made(5)
    assert resuming.restore(restored, resuming.scatter(c.mpi, state)) == 3
    again = seen(restored)
    same = c.rank != 0 or resuming.digest(again) == resuming.digest(every)
    assert c.mpi.allreduce(same, op=MPI.LAND), "the restored digest differs"
    theirs, mine = [saved.step(f, LR) for f in b[3:]], [restored.step(f, LR) for f in b[3:]]
    assert c.mpi.allreduce(theirs == mine, op=MPI.LAND), (theirs, mine)
    return {"steps_after": len(mine), "digest_matches": True}


if __name__ == "__main__":
    main()
