"""Checkpoints of a real `mpiexec -n 2 d500 train` run and `--resume` at level 3: a job whose rank 1
is killed with SIGKILL after its second checkpoint resumes and matches the unbroken run at every
evaluation (steps, accuracies, losses), for sync (every rank the same state) and local-sgd (the
ranks' models and momentum differ between averagings), for the schemes whose ranks hold pieces
(a pipeline stage, tensor shards, ZeRO-3 rows) and torch's own fsdp, dtensor and pipelining
baselines, and for a 4-rank tensor-pipeline on text (its resumed checkpoint's digest is the
unbroken run's); `d500 check` lists its restarts; the attacks: another world size, a scheme
whose state depends on timing, pieces swapped or re-gridded."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from d500.distributed.launcher import train_argv
from d500.ledger import Ledger
from d500.training import checkpoint, resume
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]
KILLED = pytest.mark.serial  # a rank is killed between a sealed checkpoint and the job's end,
# two epochs or more later: alone, not beside another test

EPOCHS = 20  # the killed job has the epochs after its second checkpoint to be caught in
SHORT = 4  # ranks holding pieces: a checkpoint every epoch, killed after the second (few steps)


def checkpoints(every):
    return ("--checkpoint-every", str(every), "--threads", "1")


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """Digits-mlp copies whose target no run reaches in EPOCHS (SHORT) epochs (every run goes to
    its end), each in a folder of its own: (the folder, {epochs: the workload file})."""
    tmp = tmp_path_factory.mktemp("resume3")
    files = {}
    for epochs in (EPOCHS, SHORT):
        (tmp / f"e{epochs}").mkdir()
        path = jobs.workload(tmp / f"e{epochs}", "digits-mlp",
                             target={"metric": "val_accuracy", "value": 0.999},
                             budget={"max_epochs": epochs, "max_seconds": 300})
        data = yaml.safe_load(path.read_text())
        data.pop("reference_convergence")
        path.write_text(yaml.safe_dump(data))
        files[epochs] = path
    return tmp, files


def killed(home, wl, entry, seed, options, every, ranks=2, nth=2):
    """A job of `ranks` ranks killed (SIGKILL of rank 1) as soon as its `nth` checkpoint is
    sealed; its run."""
    runs = home / "runs"
    before = set(runs.glob("*")) if runs.is_dir() else set()
    argv = train_argv(wl, entry, ranks, extra=("--seed", str(seed), "--repeat",
                                               *checkpoints(every)),
                      launcher_options=options)
    proc = subprocess.Popen(argv, env=jobs.environment(home), cwd=home.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline, new = time.monotonic() + 240, []
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            new = [d for d in runs.glob("*") if d not in before] if runs.is_dir() else []
            file = new[0] / "checkpoints" / checkpoint.name(nth * every) if new else None
            beat = new[0] / resume.CLOCK if new else None
            # sealed: the heartbeat written after the ledger recorded the checkpoint's sha256
            if file is not None and file.exists() and beat.exists() \
                    and beat.stat().st_mtime >= file.stat().st_mtime:
                pid = jobs.rank_process(home, 1)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and new, f"the job ended before checkpoint {nth}: {err}"
    while any(jobs.rank_process(home, r) for r in range(ranks)):
        time.sleep(0.1)  # every rank gone before the ledger is read
    # rank 0 aborted by MPICH (a dead peer mid-Allreduce): its judge ends a moment after it
    return jobs.settled(home, int(new[0].name), 30)


def refused_in_process(ledger, run_id, wl, entry, tmp, path):
    """resume.plan as `mpiexec -n 2 d500 train --resume` calls it on rank 0: edited bytes and
    another entry refused by name; the checkpoint as written is accepted."""
    from d500 import levels
    from d500.distributed import spec as specs
    from d500.distributed.judge import hyperparameters
    from d500.errors import UsageError
    from d500.training import submission

    def plan(entry_dir):
        workload, chosen = levels.of_file(wl).load(wl), submission.load(entry_dir)
        order = SimpleNamespace(entry=chosen, world_size=2,
                                spec=specs.parse(chosen.distributed, chosen.path),
                                global_batch=workload.global_batch(chosen.recipe.batch_size, 2))
        return resume.plan(ledger, run_id, workload, chosen, "torch",
                           hyperparameters(order), world_size=2)
    assert plan(entry).meta["world_size"] == 2
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    try:
        with pytest.raises(UsageError, match="sealed in the ledger"):
            plan(entry)
    finally:
        path.write_bytes(good)
    other = jobs.entry(tmp / "other", "local-sgd", name="sync-ck")  # its name, not its files
    with pytest.raises(UsageError, match="the entry's files changed"):
        plan(other)


GRIDS = {"pipeline-gpipe": "pipeline", "tensor-parallel": "tensor", "zero-3": "data",
         "fsdp-baseline": "data", "tp-baseline": "tensor", "pipelining-baseline": "pipeline"}


def pieces_are_parts(wl, state, meta, source):
    """The checkpoint of a run whose ranks hold pieces: the grid in its header, each piece
    tagged with its rank's coordinates and holding a part of the model, not all of it (a
    pipeline's stages and ZeRO-3's rows together are the model once)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from d500 import levels
    from d500.training.data import dataset
    split = GRIDS[source]
    assert meta["grid"] == {"data": 1, "pipeline": 1, "tensor": 1, split: 2}
    pieces = [state, state["ranks"][1]]
    for r, piece in enumerate(pieces):
        assert {k: int(v) for k, v in piece["scheme"].items() if k.startswith("grid/")} == {
            "grid/data": 0, "grid/pipeline": 0, "grid/tensor": 0, f"grid/{split}": r}
    workload = levels.of_file(wl).load(wl)
    model = workload.build_model(0, *dataset.shape_of(workload.dataset))
    whole = sum(numpy_helper.to_array(t).size for t in model.graph.initializer
                if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f")
    held = [sum(np.asarray(a).size for a in piece["model"].values()) for piece in pieces]
    assert all(h < whole for h in held), (held, whole)
    if GRIDS[source] != "tensor":  # (a tensor rank also holds the replicated weights)
        assert sum(held) == whole


def swapped_or_regridded_is_refused(ledger, run_id, wl, entry, path, tmp):
    """The attacks, on the killed run's checkpoint re-sealed (as if its sha256 in the ledger
    were rewritten too): the two ranks' pieces swapped, or the pieces re-tagged for another grid
    (data 2): refused by name before anything runs (one line: a UsageError)."""
    from d500 import levels
    from d500.distributed import resuming
    from d500.distributed import spec as specs
    from d500.distributed.judge import hyperparameters
    from d500.errors import UsageError
    from d500.training import submission
    workload, chosen = levels.of_file(wl).load(wl), submission.load(entry)
    spec = specs.parse(chosen.distributed, chosen.path)
    order = SimpleNamespace(entry=chosen, world_size=2, spec=spec,
                            global_batch=workload.global_batch(chosen.recipe.batch_size, 2))
    resumed = resume.plan(ledger, run_id, workload, chosen, "torch", hyperparameters(order),
                          world_size=2)
    resuming.fits(spec, 2, resumed)  # as written: accepted
    state, meta = resumed.state, resumed.meta
    own = ("steps", "rng_header", "loss_scale", *checkpoint.PARTS)
    rank0, rank1 = {k: state[k] for k in own}, state["ranks"][1]

    def resealed(forged, forged_meta, name):
        out, digest = checkpoint.write(tmp / name, meta["epoch"], forged, forged_meta)
        got, got_meta = checkpoint.read(out, digest)
        return dataclasses.replace(resumed, path=out, sha256=digest, state=got, meta=got_meta)

    swapped = resealed({**rank1, "ranks": {1: rank0}}, meta, "swapped")
    with pytest.raises(UsageError, match=r"the piece for rank 0 \(pipeline 0, data 0, tensor "
                                         r"0\) is the piece of pipeline 1, data 0, tensor 0"):
        resuming.fits(spec, 2, swapped)

    def data_grid(piece, r):  # rank r's piece re-tagged as data rank r of a 2 x 1 x 1 grid
        tags = {"grid/data": r, "grid/pipeline": 0, "grid/tensor": 0}
        return {**piece, "scheme": {**piece["scheme"], **{k: np.asarray(v, np.int64)
                                                            for k, v in tags.items()}}}
    other = {**data_grid(rank0, 0), "ranks": {1: data_grid(rank1, 1)}}
    regridded = resealed(other, {**meta, "grid": {"data": 2, "pipeline": 1, "tensor": 1}},
                         "regridded")
    with pytest.raises(UsageError, match="was taken on the grid data 2 x pipeline 1 x tensor 1, "
                                         "not this run's data 1 x pipeline 2 x tensor 1"):
        resuming.fits(spec, 2, regridded)


def swapped_with_tags_is_refused(home, run_id, wl, entry):
    """The attack the structural checks miss: the two tensor ranks' shards (equal names and
    shapes: the hidden units permuted) swapped together with their grid tags, the file re-sealed
    in a copy of the ledger (a sender controls their own). `--resume` passes `fits` and every
    rank's names and shapes; the judge's digest of what it saw at the checkpoint does not match
    the model the ranks restored: one line naming the checkpoint on every rank, exit 2, the run
    recorded failed with no result."""
    import contextlib
    import shutil
    import sqlite3
    forged = home.parent / "forged" / "home"
    # the ledger copied through SQLite: a plain copy closed a descriptor of the live file in
    # this process, which drops every POSIX lock this process holds on it (the test's open
    # connection's); a job's rank 0 closing its connection (d500.distributed.cover) then found
    # itself the last and removed the -wal and -shm under it: "database disk image is malformed"
    shutil.copytree(home, forged, ignore=shutil.ignore_patterns("ledger.sqlite*"))
    with contextlib.closing(sqlite3.connect(home / "ledger.sqlite")) as source, \
            contextlib.closing(sqlite3.connect(forged / "ledger.sqlite")) as copy:
        source.backup(copy)
    ledger = Ledger(forged / "ledger.sqlite")
    details = ledger.get(run_id)["details"]
    last = details["checkpoints"][-1]
    path = ledger.resolve_path(last["file"])
    state, meta = checkpoint.read(path, last["sha256"])
    own = ("steps", "rng_header", "loss_scale", *checkpoint.PARTS)
    rank0, rank1 = {k: state[k] for k in own}, state["ranks"][1]

    def tagged(piece, like):  # `piece`'s arrays under `like`'s grid coordinates
        tags = {k: v for k, v in like["scheme"].items() if k.startswith("grid/")}
        return {**piece, "scheme": {**piece["scheme"], **tags}}
    out, last["sha256"] = checkpoint.write(forged.parent / "file", meta["epoch"],
                                           {**tagged(rank1, rank0), "ranks": {1: tagged(rank0,
                                                                                       rank1)}},
                                           meta)
    out.replace(path)
    with sqlite3.connect(forged / "ledger.sqlite") as db:  # the sha256 re-sealed
        db.execute("UPDATE runs SET details = ? WHERE id = ?", (json.dumps(details), run_id))
    done = jobs.train(forged, 2, wl, entry, "--resume", str(run_id), "--threads", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [t for t in done.stderr.splitlines() if "error:" in t]
    assert lines and all(f"--resume {run_id}: " in t and "its pieces restore another model"
                         in t and path.name in t for t in lines), done.stderr[-3000:]
    refused = Ledger(forged / "ledger.sqlite").runs()[-1]
    assert refused["parent"] == run_id and refused["status"] == "failed", refused
    assert "its pieces restore another model" in refused["error"]
    assert not Ledger(forged / "ledger.sqlite").evaluations(refused["id"])


def series(ledger, run_id):
    return {e["step"]: e["metrics"] for e in ledger.evaluations(run_id)}


def run_id(done):
    assert done.returncode == 1 and done.stdout.strip(), done.stderr[-2000:]  # missed, by design
    return json.loads(done.stdout)[0]["run_id"]


PIECED = ("pipeline-gpipe", "tensor-parallel", "zero-3",  # each rank a stage, shard, rows,
          "fsdp-baseline", "tp-baseline", "pipelining-baseline")  # or torch's own


@KILLED
@pytest.mark.parametrize("source, options", [
    ("sync", ("-disable-auto-cleanup",)),  # rank 0 lives to record the run failed, rank lost
    # (unless MPICH aborts it, its peer dead mid-Allreduce: then interrupted, as local-sgd's)
    ("local-sgd", ()),  # mpiexec kills rank 0 too: the run shows interrupted
    *[(source, ()) for source in PIECED],
    ("ddp-baseline", ()),  # torch's DDP: every rank the whole model, as sync
])
def test_a_killed_job_resumes_at_its_world_size_and_matches_the_unbroken_run(rules, source,
                                                                            options, monkeypatch):
    tmp, files = rules
    # local-sgd killed after an epoch's 37 steps, not an averaging's multiple of 4 (at 2 epochs,
    # step 148 was one, and its ranks-differ check never ran)
    short = (*PIECED, "ddp-baseline", "local-sgd")
    epochs, every = (SHORT, 1) if source in short else (EPOCHS, 2)
    wl = files[epochs]
    home = tmp / source / "home"
    entry = jobs.entry(tmp / source, source, name=f"{source}-ck")
    full = run_id(jobs.train(home, 2, wl, entry, "--seed", "0", *checkpoints(every)))
    ledger = Ledger(home / "ledger.sqlite")
    assert [c["epoch"] for c in ledger.get(full)["details"]["checkpoints"]] == list(
        range(every, epochs, every))

    dead = killed(home, wl, entry, 0, options, every)
    assert dead["status"] in ("failed", "interrupted"), dead
    if dead["status"] == "failed":
        assert dead["details"].get("rank_lost") and "rank 1" in dead["error"], dead
    last = dead["details"]["checkpoints"][-1]
    path = ledger.resolve_path(last["file"])
    state, meta = checkpoint.read(path, last["sha256"])
    assert meta["world_size"] == 2 and sorted(state["ranks"]) == [1]
    if source == "local-sgd":  # between averagings (every 4 steps): the ranks differ
        assert last["step"] % 4, last
        assert any((state["model"][n] != state["ranks"][1]["model"][n]).any()
                   for n in state["model"])
    if source in PIECED:  # each rank's piece, with its coordinates, the grid in the header
        pieces_are_parts(wl, state, meta, source)

    if source == "sync":  # another world size: refused, one line, nothing recorded
        runs = len(ledger.runs())
        other = jobs.train(home, 1, wl, entry, "--resume", str(dead["id"]))
        assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr
        assert f"run {dead['id']} ran at world size 2, not 1" in other.stderr
        assert len(ledger.runs()) == runs
        refused_in_process(ledger, dead["id"], wl, entry, tmp, path)
    if source == "pipeline-gpipe":  # the attacks: pieces swapped, or re-tagged for another grid
        swapped_or_regridded_is_refused(ledger, dead["id"], wl, entry, path, tmp)
    if source == "tensor-parallel":  # the shards swapped with their tags: the judge's digest
        swapped_with_tags_is_refused(home, dead["id"], wl, entry)

    again = run_id(jobs.train(home, 2, wl, entry, "--resume", str(dead["id"]), "--threads",
                              "1"))
    row = ledger.get(again)
    info = row["details"]["resumed"]
    assert row["parent"] == dead["id"] and row["world_size"] == 2
    assert info["epoch"] == last["epoch"] and info["segments"][-1]["run"] == dead["id"]
    # every evaluation after the checkpoint is the unbroken run's, bit for bit
    after, reference = series(ledger, again), series(ledger, full)
    assert min(after) == last["step"] + 37 and max(after) == max(reference)
    assert all(after[s] == reference[s] for s in after), (after, reference)
    # its clock counts the killed segment to its last sign of life
    assert info["before"] >= last["clock"]
    assert min(e["wall_time"] for e in ledger.evaluations(again)) > info["before"]
    # its throughput: every sample over every segment's training time, the checkpoint's too
    figures = row["figures"]
    assert figures["train_time"] > last["train_time"] > 0, (figures, last)
    assert figures["samples_per_second"] * figures["train_time"] == pytest.approx(
        ledger.get(full)["figures"]["samples_per_second"]
        * ledger.get(full)["figures"]["train_time"])
    if source not in ("sync", "local-sgd"):
        return  # (d500 check's restarts are the same code for every scheme: checked below)

    # d500 check lists its restarts (and finds nothing wrong with them)
    from d500.competition.check import check
    from d500.competition.export import build
    from d500.competition.package import Package
    monkeypatch.setenv("D500_HOME", str(home))
    package = build(str(entry), tmp / source / "pkg.d500", None, None, warn=lambda text: None)
    (tmp / source / "rules" / "3-distributed").mkdir(parents=True)
    (tmp / source / "rules" / "3-distributed" / wl.name).write_bytes(wl.read_bytes())
    report = check(Package.open(package), tmp / source / "rules")
    assert not [p for p in report.problems if p.startswith("restarts")], report.problems
    assert any(c.startswith(f"restarts: run {again} resumed: segments run {dead['id']} "
                            f"({dead['status']}") for c in report.checked), report.checked


def test_a_scheme_whose_state_depends_on_timing_cannot_checkpoint(rules):
    """Refused before a step runs, nothing killed: in the parallel pass."""
    tmp, files = rules
    wl = files[EPOCHS]
    home = tmp / "async" / "home"
    done = jobs.train(home, 2, wl, jobs.ENTRIES / "async-ps", "--seed", "0",
                      "--checkpoint-every", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = [t for t in done.stderr.splitlines() if "error:" in t]
    assert len(lines) == 2 and all("scheme 'async_ps'" in t and "timing" in t for t in lines)
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []


@KILLED
def test_a_killed_tensor_pipeline_job_on_text_resumes_to_the_unbroken_runs_parameters(tmp_path):
    """tensor-pipeline ({pipeline: 2, tensor: 2}, 4 ranks: each rank a tensor shard of a
    stage, AdamW) on a tiny text-lm (2 transformer layers, one a stage; 2 documents, 20 steps
    an epoch), checkpointed every epoch, rank 1 killed once the first is sealed, resumed: the
    checkpoint the resumed run takes at epoch 2 has the judge's digest of the unbroken run's at
    epoch 2 (the whole model, every rank's shard and its AdamW state, bit for bit), and every
    evaluation after the resume is the unbroken run's."""
    wl = jobs.workload(
        tmp_path, "text-lm", budget={"max_epochs": 3, "max_seconds": 300},
        model={"builder": "transformer", "layers": 2, "width": 16, "heads": 2, "tied": True},
        dataset={"name": "python-stdlib", "train": 2, "validation": 1, "test": 1,
                 "split_seed": 368, "context": 16, "vocab": 300, "tokens_sha256": None},
        evaluation={"every_steps": 5}, target={"metric": "val_log_perplexity", "value": 0.5})
    home = tmp_path / "home"
    entry = jobs.entry(tmp_path, "tensor-pipeline", name="tensor-pipeline-ck")
    full = run_id(jobs.train(home, 4, wl, entry, "--seed", "0", *checkpoints(1),
                             timeout=300))
    ledger = Ledger(home / "ledger.sqlite")
    unbroken = {c["epoch"]: c for c in ledger.get(full)["details"]["checkpoints"]}
    assert sorted(unbroken) == [1, 2]
    dead = killed(home, wl, entry, 0, (), 1, ranks=4, nth=1)
    assert dead["status"] in ("failed", "interrupted"), dead
    last = dead["details"]["checkpoints"][-1]
    state, meta = checkpoint.read(ledger.resolve_path(last["file"]), last["sha256"])
    assert meta["grid"] == {"data": 1, "pipeline": 2, "tensor": 2}
    assert sorted(state["ranks"]) == [1, 2, 3]
    assert last["whole_sha256"] == unbroken[last["epoch"]]["whole_sha256"]
    again = run_id(jobs.train(home, 4, wl, entry, "--resume", str(dead["id"]), "--threads",
                              "1", timeout=300))
    row = ledger.get(again)
    assert row["parent"] == dead["id"] and row["details"]["resumed"]["epoch"] == last["epoch"]
    taken = {c["epoch"]: c for c in row["details"]["checkpoints"]}
    assert 2 in taken and last["epoch"] < 2
    assert taken[2]["whole_sha256"] == unbroken[2]["whole_sha256"]  # the same parameters
    after, reference = series(ledger, again), series(ledger, full)
    assert after and max(after) == max(reference)
    assert all(after[s] == reference[s] for s in after), (after, reference)
