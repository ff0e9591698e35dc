"""Checkpoints of a real `mpiexec -n 2 d500 train` run and `--resume` at level 3: a job whose rank 1
is killed with SIGKILL after its second checkpoint resumes and matches the unbroken run at every
evaluation (steps, accuracies, losses), for sync (every rank the same state) and local-sgd (the
ranks' models and momentum differ between averagings), and `d500 check` lists its restarts; the
attacks: another world size, a scheme whose state depends on timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from d500.distributed.launcher import train_argv
from d500.ledger import Ledger
from d500.training import checkpoint, resume
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.serial,  # a rank is killed on a timer: alone
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

EPOCHS = 20  # the killed job has the epochs after its second checkpoint to be caught in
CHECKPOINTS = ("--checkpoint-every", "2", "--threads", "1")


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """A digits-mlp copy whose target no run reaches in EPOCHS epochs (every run goes to its
    end), in a folder of its own."""
    tmp = tmp_path_factory.mktemp("resume3")
    path = jobs.workload(tmp, "digits-mlp", target={"metric": "val_accuracy", "value": 0.999},
                         budget={"max_epochs": EPOCHS, "max_seconds": 300})
    data = yaml.safe_load(path.read_text())
    data.pop("reference_convergence")
    path.write_text(yaml.safe_dump(data))
    return tmp, path


def killed(home, wl, entry, seed, options):
    """A job killed (SIGKILL of rank 1) as soon as its second checkpoint is sealed; its run."""
    runs = home / "runs"
    before = set(runs.glob("*")) if runs.is_dir() else set()
    argv = train_argv(wl, entry, 2, extra=("--seed", str(seed), "--repeat", *CHECKPOINTS),
                      launcher_options=options)
    proc = subprocess.Popen(argv, env=jobs.environment(home), cwd=home.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline, new = time.monotonic() + 240, []
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            new = [d for d in runs.glob("*") if d not in before] if runs.is_dir() else []
            file = new[0] / "checkpoints" / checkpoint.name(4) if new else None
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
    assert proc.returncode != 0 and new, f"the job ended before its second checkpoint: {err}"
    while any(jobs.rank_process(home, r) for r in (0, 1)):
        time.sleep(0.1)  # every rank gone before the ledger is read
    return Ledger(home / "ledger.sqlite").get(int(new[0].name))


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


def series(ledger, run_id):
    return {e["step"]: e["metrics"] for e in ledger.evaluations(run_id)}


def run_id(done):
    assert done.returncode == 1, done.stderr[-2000:]  # missed, by design
    return json.loads(done.stdout)[0]["run_id"]


@pytest.mark.parametrize("source, options", [
    ("sync", ("-disable-auto-cleanup",)),  # rank 0 lives to record the run failed, rank lost
    ("local-sgd", ()),  # mpiexec kills rank 0 too: the run shows interrupted
])
def test_a_killed_job_resumes_at_its_world_size_and_matches_the_unbroken_run(rules, source,
                                                                            options, monkeypatch):
    tmp, wl = rules
    home = tmp / source / "home"
    entry = jobs.entry(tmp / source, source, name=f"{source}-ck")
    full = run_id(jobs.train(home, 2, wl, entry, "--seed", "0", *CHECKPOINTS))
    ledger = Ledger(home / "ledger.sqlite")
    assert [c["epoch"] for c in ledger.get(full)["details"]["checkpoints"]] == list(
        range(2, EPOCHS, 2))

    dead = killed(home, wl, entry, 0, options)
    assert dead["status"] in ("failed", "interrupted"), dead
    if dead["status"] == "failed":
        assert dead["details"]["rank_lost"] and "rank 1" in dead["error"], dead
    last = dead["details"]["checkpoints"][-1]
    state, meta = checkpoint.read(ledger.resolve_path(last["file"]), last["sha256"])
    assert meta["world_size"] == 2 and sorted(state["ranks"]) == [1]
    if source == "local-sgd" and last["step"] % 4:  # between averagings: the ranks differ
        assert any((state["model"][n] != state["ranks"][1]["model"][n]).any()
                   for n in state["model"])

    if source == "sync":  # another world size: refused, one line, nothing recorded
        runs = len(ledger.runs())
        other = jobs.train(home, 1, wl, entry, "--resume", str(dead["id"]))
        assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr
        assert f"run {dead['id']} ran at world size 2, not 1" in other.stderr
        assert len(ledger.runs()) == runs
        refused_in_process(ledger, dead["id"], wl, entry, tmp, ledger.resolve_path(last["file"]))

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
    tmp, wl = rules
    home = tmp / "async" / "home"
    done = jobs.train(home, 2, wl, jobs.ENTRIES / "async-ps", "--seed", "0",
                      "--checkpoint-every", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = [t for t in done.stderr.splitlines() if "error:" in t]
    assert len(lines) == 2 and all("scheme 'async_ps'" in t and "timing" in t for t in lines)
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []
