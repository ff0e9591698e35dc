"""Checkpoints and `d500 train --resume` with real runs: a run killed with SIGKILL after its second
checkpoint resumes and matches the unbroken run at every evaluation, bit for bit; its time counts
every segment. The attacks: an edited checkpoint, a second resume of one run (the CLI refuses
it; two resumes planned at once through the library are flagged by `d500 check`), resuming a
finished run or a run of another workload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from d500.errors import UsageError
from d500.ledger import Ledger
from d500.training import checkpoint, resume, submission, workloads
from d500.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
EPOCHS = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A digits-MLP workload whose target no run reaches in EPOCHS epochs (so every run goes to
    its end), a copy under another name, and an entry that enters both."""
    tmp = tmp_path_factory.mktemp("resume")
    base = yaml.safe_load((ROOT / "levels" / "2-training" / "digits-mlp.yaml").read_text())
    base.pop("reference_convergence")
    for name in ("digits-ck", "digits-ck2"):
        base.update(name=name, target={"metric": "val_accuracy", "value": 0.999},
                    budget={"max_epochs": EPOCHS, "max_seconds": 300})
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(base))
    entry = yaml.safe_load((ROOT / "submissions" / "sgd-momentum" / "submission.yaml")
                           .read_text())
    entry.update(name="ck-entry", workloads=["digits-ck", "digits-ck2"])
    (tmp / "entry").mkdir()
    (tmp / "entry" / "submission.yaml").write_text(yaml.safe_dump(entry))
    return tmp


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "D500_HOME": str(tmp / "home"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("D500_DATA", None)
    return env


def d500(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", "train", *args,
                           "--submission", str(tmp / "entry")], capture_output=True, text=True,
                          timeout=600, cwd=tmp, env=_env(tmp))


def killed(tmp: Path, seed: int) -> int:
    """A real run killed with SIGKILL as soon as its second checkpoint is on disk; its id."""
    home = tmp / "home" / "runs"
    before = set(home.glob("*")) if home.is_dir() else set()
    proc = subprocess.Popen([sys.executable, "-m", "d500.cli", "train", "digits-ck.yaml",
                             "--submission", str(tmp / "entry"), "--seed", str(seed), "--repeat",
                             "--checkpoint-every", "2", "--threads", "1"], cwd=tmp, env=_env(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        new = [d for d in home.glob("*") if d not in before] if home.is_dir() else []
        file, beat = (new[0] / "checkpoints" / checkpoint.name(4),
                      new[0] / resume.CLOCK) if new else (None, None)
        # sealed: the heartbeat written after the ledger recorded the checkpoint's sha256
        if file is not None and file.exists() and beat.stat().st_mtime >= file.stat().st_mtime:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    assert proc.wait() == -signal.SIGKILL, "the run ended before its second checkpoint"
    return int(new[0].name)


def _ledger(tmp: Path, monkeypatch) -> Ledger:
    monkeypatch.setenv("D500_HOME", str(tmp / "home"))
    return Ledger()


def _series(ledger: Ledger, run_id: int) -> dict[int, tuple[float, float]]:
    return {e["step"]: (e["metrics"]["val_accuracy"], e["metrics"]["train_loss"])
            for e in ledger.evaluations(run_id)}


def _train(tmp: Path, ledger: Ledger, seed: int, resumed: resume.Resumed | None = None) -> int:
    wl = workloads.load(tmp / "digits-ck.yaml")
    entry = submission.load(tmp / "entry")
    result = train(wl, entry.recipe, "torch", seed, ledger=ledger, submission=entry.name,
                   submission_files=entry.files, checkpoints=resume.Checkpoints(2),
                   resume=resumed)
    assert result.status == "missed", result.error  # by design: every run goes to its end
    return result.run_id


def _plan(tmp: Path, ledger: Ledger, run_id: int, workload: str = "digits-ck.yaml"
          ) -> resume.Resumed:
    wl = workloads.load(tmp / workload)
    return resume.plan(ledger, run_id, wl, submission.load(tmp / "entry"), "torch")


def test_a_killed_run_resumes_and_matches_the_unbroken_run(setup, monkeypatch):
    tmp = setup
    ledger = _ledger(tmp, monkeypatch)
    # the unbroken run computes at the killed run's count; the resume, given none, takes the
    # count the killed run recorded (the default would follow the machine's load)
    from d500 import threads
    monkeypatch.setattr(threads, "_setting", {"count": 1, "set_by": "--threads"})
    from d500.training.seeds import required
    seed = required(2, "digits-ck", "ck-entry", "torch", 3)[0]  # scored: on the seeds board
    full = _train(tmp, ledger, seed)
    written = ledger.get(full)["details"]["checkpoints"]
    assert [c["epoch"] for c in written] == [2, 4, 6]
    for c in written:  # each file is what the ledger sealed
        path = ledger.resolve_path(c["file"])
        assert path.name == checkpoint.name(c["epoch"])
        checkpoint.read(path, c["sha256"])
    with pytest.raises(UsageError, match=f"run {full} finished \\(missed\\)"):
        _plan(tmp, ledger, full)

    first = killed(tmp, seed)
    dead = ledger.get(first)
    assert dead["status"] == "interrupted" and len(dead["details"]["checkpoints"]) >= 2
    last = dead["details"]["checkpoints"][-1]
    path = ledger.resolve_path(last["file"])

    # an edited checkpoint is refused by name, and nothing is recorded
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    runs = len(ledger.runs())
    edited = d500(tmp, "digits-ck.yaml", "--resume", str(first))
    assert edited.returncode == 2 and str(path) in edited.stderr
    assert "sealed in the ledger" in edited.stderr and "Traceback" not in edited.stderr
    assert len(ledger.runs()) == runs
    path.write_bytes(good)

    # an entry whose files changed since (another optimizer file, a yaml edit) is refused
    yaml_file = tmp / "entry" / "submission.yaml"
    text = yaml_file.read_text()
    yaml_file.write_text(text + "# changed after the kill\n")
    with pytest.raises(UsageError, match=f"the entry's files changed since run {first}"):
        _plan(tmp, ledger, first)
    yaml_file.write_text(text)

    # another workload's resume is refused
    with pytest.raises(UsageError, match="is a run of workload 'digits-ck', not 'digits-ck2'"):
        _plan(tmp, ledger, first, "digits-ck2.yaml")

    resumed = d500(tmp, "digits-ck.yaml", "--resume", str(first), "--json")
    assert resumed.returncode == 1, resumed.stderr
    second = json.loads(resumed.stdout)[0]["run_id"]
    row = ledger.get(second)
    info = row["details"]["resumed"]
    assert row["parent"] == first and row["seed"] == seed and info["epoch"] == last["epoch"]
    assert row["provenance"]["threads"] == {
        "count": 1, "set_by": f"the resumed run {first} recorded it (--threads)"}
    # its throughput is every sample trained over every segment's training time (the one the
    # checkpoint carries, then its own): once, its own segment's alone (epochs 5-8 in 0.29 s,
    # the samples of all 8: 32139/s, while the clock read 0.24 s at the epoch-4 checkpoint)
    figures, unbroken = row["figures"], ledger.get(full)["figures"]
    samples = unbroken["samples_per_second"] * unbroken["train_time"]
    assert figures["samples_per_second"] * figures["train_time"] == pytest.approx(samples)
    assert figures["train_time"] > last["train_time"] > 0, (figures, last)
    for name in ("train_time", "eval_time", "data_time"):  # each at least the checkpoint's
        assert figures[name] >= last[name], (name, figures, last)
    # every evaluation after the checkpoint equals the unbroken run's, bit for bit
    after = _series(ledger, second)
    reference = _series(ledger, full)
    assert after and all(after[s] == reference[s] for s in after)
    assert min(after) == last["step"] + 37 and max(after) == max(reference)
    # its clock counts the killed segment to its last sign of life
    killed_evals = [e["wall_time"] for e in ledger.evaluations(first)]
    assert info["before"] >= max(*killed_evals, last["clock"])
    assert min(e["wall_time"] for e in ledger.evaluations(second)) > info["before"]
    assert info["segments"][-1]["run"] == first

    # the same run resumed again: refused (one checkpoint continues once)
    with pytest.raises(UsageError, match=f"already resumed by run {second}"):
        _plan(tmp, ledger, first)

    # the seeds board marks it and notes its segments
    from d500.training import score, views
    view = views.seeds_view(score.entries(ledger.runs(workload="digits-ck")))
    assert any("(1 resumed)" in cell for row in view.rows for cell in row), view.rows
    assert any(n.startswith("resumed:") and f"run {second} continued run {first}" in n
               for n in view.notes), view.notes


def test_two_continuations_of_one_checkpoint_are_flagged_by_check(setup, monkeypatch):
    tmp = setup
    first = killed(tmp, 4)
    ledger = _ledger(tmp, monkeypatch)
    # both planned before either is recorded (two resumes started at once), both trained
    for p in [_plan(tmp, ledger, first) for _ in range(2)]:
        _train(tmp, ledger, p.meta["seed"], p)
    from d500.competition.check import check
    from d500.competition.export import build
    from d500.competition.package import Package
    out = build(str(tmp / "entry"), tmp / "pkg.d500", None, None, warn=lambda text: None)
    rules = tmp / "rules" / "2-training"
    rules.mkdir(parents=True)
    for name in ("digits-ck.yaml", "digits-ck2.yaml"):
        (rules / name).write_bytes((tmp / name).read_bytes())
    report = check(Package.open(out), tmp / "rules")
    flagged = [p for p in report.problems if p.startswith("restarts:")]
    assert len(flagged) == 1 and "was resumed by runs" in flagged[0], report.problems
    assert any(c.startswith("restarts: run") and f"run {first} (interrupted" in c
               for c in report.checked)
    assert not [p for p in report.problems if p.startswith("consistency")], report.problems

    # a forger who re-seals a resumed run with its earlier segment's time left off is flagged
    from tests.competition.packages import repack, reseal
    second = max(r.origin_id for r in Package.open(out).runs())

    def forget(rec: dict) -> None:
        details = json.loads(rec["row"]["details"])
        details["resumed"]["before"] = 0.0
        rec["row"]["details"] = json.dumps(details)
    forged = repack(out, tmp / "forged.d500", reseal(second, record=forget))
    found = check(Package.open(forged), tmp / "rules").problems
    assert any("a segment's time left off" in p and f"run {second}" in p for p in found), found


@pytest.mark.parametrize("backend, optimizer, native", [
    ("torch", "adam", False), ("torch", "adam", True), ("reference", "momentum", False),
    ("tensorflow", "lamb", False)])
def test_a_restored_trainer_continues_as_the_one_that_was_saved(tmp_path, backend, optimizer,
                                                                native):
    """capture -> write -> read -> restore into a fresh trainer: the next steps' losses are the
    saved trainer's, bit for bit (model, optimizer slots and step count, RNG states)."""
    from d500 import backends
    from d500.training.data import dataset
    from d500.training.optimizers import make
    from d500.training.trainable import trainable_model
    wl = workloads.load(ROOT / "levels" / "2-training" / "digits-mlp.yaml")
    parts, _ = dataset.parts(wl.dataset)
    batches = [{"input": parts.train.x[i:i + 16], "labels": parts.train.y[i:i + 16]}
               for i in range(0, 160, 16)]
    cls = backends.get(backend)

    def fresh():
        return cls.prepare(trainable_model(wl, 0)).trainer(make(optimizer, lr=0.01),
                                                           loss="loss", native=native)
    saved = fresh()
    for b in batches[:5]:
        saved.step(b, 0.01)
    state = checkpoint.capture(saved, 5)
    path, digest = checkpoint.write(tmp_path, 1, state, {"seed": 0})
    again, meta = checkpoint.read(path, digest)
    restored = fresh()
    assert checkpoint.restore(restored, again) == 5 and meta["epoch"] == 1
    for b in batches[5:]:
        assert restored.step(b, 0.01) == saved.step(b, 0.01)
    with pytest.raises(checkpoint.CheckpointError, match="sealed in the ledger"):
        checkpoint.read(path, "0" * 64)


def test_a_checkpoint_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "runs").write_text("a file where the runs' folder goes")
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "digits-mlp",
                           "--submission", "sgd-momentum", "--seed", "1",
                           "--checkpoint-every", "1"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=_env(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{tmp_path / 'home' / 'runs'}: cannot write checkpoints there" in done.stderr
    assert Ledger(tmp_path / "home" / "ledger.sqlite").runs() == []  # nothing recorded
