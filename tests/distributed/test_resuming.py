"""Level-3 checkpoints in one process (d500.distributed.resuming): each scheme that can be
checkpointed, saved through a checkpoint file and restored into a fresh one, continues bit for
bit (model, optimizer slots, the scheme's own state: its step count, its compressor's residuals
and state, a ZeRO rank's block of the optimizer state, a ZeRO-3 rank's rows); a piece that is
not the rank's own is refused; the schemes that cannot are refused naming why. The
kill-and-resume of real `mpiexec -n 2` jobs is test_resume_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest

from d500.distributed import resuming
from d500.distributed import spec as specs
from d500.distributed.comm import Communicator
from d500.distributed.schemes import make, make_reducer
from d500.distributed.schemes.zero import Zero
from d500.training import checkpoint
from tests.distributed.test_schemes import LR, feeds, trainer

COMPRESSION = {"topk": {"density": 0.1}, "randomk": {"density": 0.1}, "qsgd": {"levels": 4},
               "powersgd": {"rank": 2}, "efsignsgd": {}}


def scheme(name: str, optimizer: str, seed: int = 0):
    """A started scheme `name` (zero1, zero2: sync sharded; sync+C: sync compressed by C) over
    one rank (a compressor compresses at one rank too)."""
    t, comm = trainer("torch", optimizer, seed=seed), Communicator(None)
    if name == "zero3":  # layer by layer: the trainer is its rows (and their optimizer state)
        from d500 import backends
        from d500.builders import build
        from d500.distributed.schemes.zero3 import Zero3
        from d500.training.optimizers.registry import make as make_optimizer
        s = Zero3(build("mlp", (1, 8, 8), 10, seed=seed, loss=True), backends.get("torch"),
                  make_optimizer(optimizer, lr=LR), comm)
    elif name.startswith("zero"):
        s = Zero(t, comm, stage=int(name[-1]))
    elif "+" in name:
        name, compressor = name.split("+")
        s = make(name, t, comm, reducer=make_reducer(comm, compressor, COMPRESSION[compressor]))
    else:
        s = make(name, t, comm, **({"period": 3} if name == "local_sgd" else {}))
    s.start()
    return s


@pytest.mark.parametrize("name, optimizer", [
    ("sync", "momentum"), ("local_sgd", "momentum"), ("dpsgd", "adam"), ("ps", "adam"),
    ("zero1", "adam"), ("zero2", "adam"), ("zero3", "adam"),
    *[(f"sync+{c}", "momentum") for c in COMPRESSION],
    ("ps+topk", "sgd")])
def test_a_restored_scheme_continues_as_the_one_that_was_saved(tmp_path, name, optimizer):
    batches = feeds(10)
    saved = scheme(name, optimizer)
    for f in batches[:5]:
        saved.step(f, LR)
    every = resuming.gather(None, resuming.capture(saved, 5))
    path, digest = checkpoint.write(tmp_path, 1, every, {"world_size": 1})
    state, _ = checkpoint.read(path, digest)
    restored = scheme(name, optimizer, seed=1)  # another model: everything must come back
    assert resuming.restore(restored, resuming.scatter(None, state)) == 5
    assert restored.steps == 5
    for f in batches[5:]:
        assert restored.step(f, LR) == saved.step(f, LR)
    mine, theirs = restored.trainer.parameters(), saved.trainer.parameters()
    assert all(np.array_equal(mine[n], theirs[n]) for n in mine)


@pytest.mark.parametrize("compressor", ["topk", "powersgd"])
def test_a_compressed_scheme_without_its_residuals_does_not_continue(compressor):
    """Error feedback's residuals (and PowerSGD's warm start) matter: a restore without them
    would diverge (so the test above can fail)."""
    batches = feeds(8)
    saved = scheme(f"sync+{compressor}", "momentum")
    for f in batches[:4]:
        saved.step(f, LR)
    state = resuming.capture(saved, 4)
    state["scheme"] = {"steps": state["scheme"]["steps"]}
    assert len(resuming.capture(saved, 4)["scheme"]) > 1
    restored = scheme(f"sync+{compressor}", "momentum")
    resuming.restore(restored, state)
    assert [restored.step(f, LR) for f in batches[4:]] != [saved.step(f, LR) for f in batches[4:]]


def test_a_zero_rank_without_its_block_state_does_not_continue(tmp_path):
    """The block's Adam moments matter: a restore that skipped them would diverge (so the test
    above can fail)."""
    batches = feeds(8)
    saved = scheme("zero1", "adam")
    for f in batches[:4]:
        saved.step(f, LR)
    state = resuming.capture(saved, 4)
    state["scheme"] = {"steps": state["scheme"]["steps"], **{
        k: np.zeros_like(v) if k.startswith("block/slot") else v
        for k, v in state["scheme"].items() if k.startswith("block/")}}
    restored = scheme("zero1", "adam")
    resuming.restore(restored, state)
    assert [restored.step(f, LR) for f in batches[4:]] != [saved.step(f, LR) for f in batches[4:]]


@pytest.mark.parametrize("mapping, why", [
    ({"scheme": "async_ps"}, "scheme 'async_ps': which gradients rank 0 applied"),
    ({"scheme": "ssp"}, "scheme 'ssp': which gradients rank 0 applied"),
    ({"scheme": "ddp"}, ""),  # its trainer, as sync's
    ({"scheme": "fsdp"}, ""),  # its local shards (fsdp.Shards)
    ({"scheme": "dtensor", "tensor": 2}, ""), ({"scheme": "pipelining", "pipeline": 2}, ""),
    ({"scheme": "sync", "shard": "zero3"}, ""), ({"scheme": "sync", "pipeline": 2}, ""),
    ({"scheme": "sync", "tensor": 2}, ""),
    ({"scheme": "sync"}, ""), ({"scheme": "local_sgd"}, ""), ({"scheme": "dpsgd"}, ""),
    ({"scheme": "ps"}, ""), ({"scheme": "sync", "shard": "zero2"}, ""),
    ({"scheme": "sync", "compression": {"name": "topk", "density": 0.1}}, ""),
])
def test_what_cannot_be_checkpointed_exactly_is_refused_naming_why(mapping, why):
    found = resuming.refusal(specs.parse(mapping, "entry/submission.yaml"))
    assert why in found if why else found == ""


def test_zero3_of_a_model_with_running_statistics_is_refused_naming_why():
    """ZeRO-3 of a model with BatchNormalization gathers the whole model (zero.py's stage 3,
    storage freed through torch): not checkpointed; layer by layer (an MLP) is."""
    from d500.builders import build
    spec = specs.parse({"scheme": "sync", "shard": "zero3"}, "entry/submission.yaml")
    resnet = build("resnet20", (3, 8, 8), 10, seed=0, loss=True)
    assert "running statistics" in resuming.refusal(spec, resnet)
    assert resuming.refusal(spec, build("mlp", (1, 8, 8), 10, seed=0, loss=True)) == ""


@pytest.mark.parametrize("forged", ["coordinates", "part"])
def test_a_rank_refuses_a_piece_that_is_not_its_own(forged):
    """The last guard of a resume, on each rank: a piece tagged with another coordinate, or
    holding another part of the model (names, shapes), is refused by name before anything is
    put back (the file's grid and tags are checked first on rank 0: test_resume_mpi.py)."""
    from d500.errors import D500Error
    saved = scheme("zero3", "adam")
    state = resuming.capture(saved, 0)
    if forged == "coordinates":
        state["scheme"]["grid/data"] = np.asarray(1, np.int64)
        why = "the piece of pipeline 0, data 1, tensor 0"
    else:  # a row block of another shape (another rank's rows, another model)
        name = sorted(state["model"])[0]
        state["model"][name] = state["model"][name][:-1]
        why = f"model '{name}' is of shape"
    restored = scheme("zero3", "adam", seed=1)
    before = restored.trainer.parameters()[sorted(state["model"])[0]].copy()
    with pytest.raises(D500Error, match=why):
        resuming.restore(restored, state)
    assert np.array_equal(restored.trainer.parameters()[sorted(state["model"])[0]], before)


def test_the_judge_beats_its_heartbeat_while_the_ranks_train_a_long_chunk():
    """The ranks send no ticks within a chunk: the judge reads the budget (which writes its
    heartbeat) every HEARTBEAT s while it waits, so that a job killed mid-chunk has its time
    since the last checkpoint charged; the wait still ends at its timeout, or when rank 0
    speaks."""
    import multiprocessing
    import time

    from d500.distributed.judge import Ranks
    from d500.training.resume import HEARTBEAT
    conn, rank0 = multiprocessing.Pipe()
    lost, _ = multiprocessing.Pipe()
    ranks = Ranks(conn, lost)
    read = []
    ranks.remaining = lambda: read.append(time.monotonic()) or 100.0
    t = time.monotonic()
    assert ranks._poll(2.5 * HEARTBEAT) is False
    assert time.monotonic() - t >= 2.5 * HEARTBEAT and len(read) >= 2
    rank0.send(("trained",))
    assert ranks._poll(None) is True


@pytest.mark.parametrize("lost", [True, False])
def test_a_failed_run_resumes_only_when_a_rank_was_lost(tmp_path, lost):
    """A level-3 run whose rank died is recorded failed by a surviving rank 0 with `rank_lost`:
    resumable (here it wrote no checkpoint, the next check); one whose entry code raised is
    not (restarting a crash is not a restart)."""
    from types import SimpleNamespace

    from d500 import levels
    from d500.distributed.judge import hyperparameters
    from d500.errors import UsageError
    from d500.ledger import Ledger
    from d500.training import resume, submission
    from tests.distributed.level3_jobs import ENTRIES, LEVEL3
    path = LEVEL3 / "digits-mlp.yaml"
    wl, entry = levels.of_file(path).load(path), submission.load(ENTRIES / "sync")
    order = SimpleNamespace(entry=entry, world_size=2, spec=specs.parse(entry.distributed,
                                                                        entry.path),
                            global_batch=wl.global_batch(entry.recipe.batch_size, 2))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with ledger.start_run(level=3, workload=wl.name, submission=entry.name, backend="torch",
                          seed=0, hyperparameters=hyperparameters(order), workload_file=wl.path,
                          submission_files=list(entry.files), world_size=2, rank=0) as run:
        run.finish("failed", error="rank 1 (pid 1 on here) died",
                   details={"rank_lost": True} if lost else {})
    why = "wrote no checkpoint" if lost else "finished \\(failed\\)"
    with pytest.raises(UsageError, match=f"--resume {run.id}: run {run.id} {why}"):
        resume.plan(ledger, run.id, wl, entry, "torch", hyperparameters(order), world_size=2)


def test_the_judges_digest_tells_pieces_swapped_with_their_tags(tmp_path):
    """Two ZeRO-3 pieces of equal shapes swapped together with their grid tags pass every
    structural check (fits, restore's names and shapes); the digest of what the judge saw (the
    whole model, each rank's piece and optimizer state in rank order) does not: the resume is
    refused naming the checkpoint, and one whose ledger record holds no digest is refused too."""
    from types import SimpleNamespace

    batches = feeds(6)
    ranks, wholes = [], []
    for r, seed in enumerate((0, 1)):  # two pieces: same names and shapes, other values
        s = scheme("zero3", "adam", seed=seed)
        for f in batches[:3]:
            s.step(f, LR)
        piece = resuming.capture(s, 3)
        piece["scheme"]["grid/data"] = np.asarray(r, np.int64)
        ranks.append(piece)
        with s.evaluated():  # the whole model, gathered as for an evaluation
            wholes.append(s.handed())
    whole = wholes[0]
    saw = {**ranks[0], "ranks": {1: ranks[1]}, "whole": whole}
    sealed = resuming.digest(saw)
    again = {**ranks[0], "ranks": {1: ranks[1]}, "whole": {k: v.copy() for k, v in whole.items()}}
    assert resuming.digest(again) == sealed
    assert resuming.digest({**saw, "whole": wholes[1]}) != sealed  # another whole model

    def retagged(piece, r):
        return {**piece, "scheme": {**piece["scheme"], "grid/data": np.asarray(r, np.int64)}}
    swapped = {**retagged(ranks[1], 0), "ranks": {1: retagged(ranks[0], 1)}, "whole": whole}
    assert resuming._coords(swapped, 0) == resuming._coords(saw, 0)  # the tags pass
    assert resuming.digest(swapped) != sealed
    resumed = SimpleNamespace(parent=7, path=tmp_path / "epoch-0002.npz", whole=sealed)
    resuming.verify(resumed, saw)  # as saved: accepted
    for seen in (swapped, None):
        with pytest.raises(resuming.Refused, match=r"--resume 7: .*epoch-0002.npz: its pieces "
                                                   r"restore another model"):
            resuming.verify(resumed, seen)
    with pytest.raises(resuming.Refused, match="holds no digest"):
        resuming.verify(SimpleNamespace(parent=7, path=resumed.path, whole=None), saw)
    assert resuming.Refused("x").exit_code == 2
