"""`d500 train ... --checkpoint-every K` and `--resume RUN`: the supervisor's checkpoints of a
level-2 run (level 3: its judge's, every rank's state, d500.distributed.resuming), sealed in its
ledger row, and the continuation of a killed or interrupted run (level 3: at its world size).

The judge owns all of it; the worker only hands its state over (d500.training.checkpoint):
- the supervisor writes `runs/<id>/checkpoints/epoch-NNNN.npz` after every K epochs, on the
  run's clock, and records its sha256 and the clock's reading in the run's details at once
  (a killed run's row keeps them; the ledger seals it when the dead run is reaped);
- it also writes its clock's reading to `runs/<id>/clock.json` at most every HEARTBEAT s, so
  that the time a killed segment ran after its last checkpoint is charged too;
- `--resume RUN` opens a new run whose parent is RUN, with RUN's workload, entry (its files'
  sha256), backend, hyperparameters and seed. Its clock starts at what the earlier segments
  took (every segment's time until it was last seen alive, checkpoint writing and reading
  included), its details list every segment (`resumed`), and it continues from RUN's last
  checkpoint after checking the file's sha256 against the ledger's;
- refused, with one line and nothing recorded: a run that finished or is still running, a run
  of another workload, entry, backend, seed or world size, an edited or missing checkpoint, and
  a run that was already resumed (restarting one checkpoint several times to keep the luckiest
  continuation: `d500 check` also flags a checkpoint that started more than one run).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import UsageError
from d500.ledger.lifecycle import FINAL
from d500.training import checkpoint

HEARTBEAT = 1.0  # seconds between writes of the supervisor's clock reading
CLOCK = "clock.json"
FOLDER = "checkpoints"
WHOLE = "whole_sha256"  # a checkpoint's record: the digest of what the judge saw (level 3)
FINISHED = tuple(s for s in FINAL if s != "interrupted")  # what cannot be resumed


@dataclass
class Checkpoints:
    """What the supervisor checkpoints: every `every` epochs, under the run's folder."""

    every: int
    written: list[dict[str, Any]] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)  # what the run is (set by train)


@dataclass
class Resumed:
    """Where a resumed run starts: the checkpoint (checked) and the earlier segments' time."""

    parent: int
    path: Path
    sha256: str
    state: dict[str, Any]
    meta: dict[str, Any]
    before: float  # seconds of the run's clock that the earlier segments took
    segments: list[dict[str, Any]]
    whole: str | None = None  # level 3, ranks holding pieces: what the judge saw (its digest)

    @property
    def epoch(self) -> int:
        return int(self.meta["epoch"])

    def details(self, ledger: Any) -> dict[str, Any]:
        """What the resumed run records (at once, so that a kill keeps it)."""
        return {"resumed": {"from_run": self.parent, "checkpoint": ledger.store_path(self.path),
                            "sha256": self.sha256, "epoch": self.epoch, "step": self.meta["step"],
                            "before": self.before, "segments": self.segments,
                            **({WHOLE: self.whole} if self.whole else {})}}


def every(value: str) -> int:
    """--checkpoint-every K: a whole number of epochs, at least 1."""
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        import argparse
        raise argparse.ArgumentTypeError(f"must be a whole number of epochs >= 1, got '{value}'")
    return k


class Heartbeat:
    """The supervisor's clock reading in the run's folder, written at most every HEARTBEAT s
    (write then rename)."""

    def __init__(self, folder: Path):
        self.file, self.last = folder / CLOCK, -HEARTBEAT

    def beat(self, clock: float, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= HEARTBEAT:
            self.last = now
            temporary = self.file.with_suffix(".tmp")
            temporary.write_text(json.dumps({"clock": clock, "wall": time.time()}))
            temporary.replace(self.file)


def opened(run: Any, ledger: Any, checkpoints: Checkpoints | None, resumed: Resumed | None,
           identity: dict[str, Any]) -> None:
    """What a run does as it opens: a resumed run records where it started (at once, so that a
    kill keeps it); a checkpointing one keeps `identity` (what the run is) for its files."""
    if resumed is not None:
        run.record(details=resumed.details(ledger))
    if checkpoints is not None:
        checkpoints.identity = {**identity, "run": run.id}


def record(run: Any, written: list[dict[str, Any]]) -> None:
    """The checkpoints written so far, in the run's details now (a killed run keeps them)."""
    run.record(details={"checkpoints": written})


def _refuse(run_id: int, why: str) -> UsageError:
    return UsageError(f"--resume {run_id}: {why}")


def _time(ledger: Any, row: dict[str, Any]) -> float:
    """Seconds of the run's clock until it was last seen alive: its heartbeat, its last
    checkpoint or its last evaluation, whichever is latest (each is cumulative over segments)."""
    seen = [float(c["clock"]) for c in row["details"].get("checkpoints", [])]
    seen += [float(e["wall_time"]) for e in row["evaluations"] if e["wall_time"] is not None]
    seen.append(float(row["details"].get("resumed", {}).get("before", 0.0)))
    if row["mllog"]:
        beat = ledger.resolve_path(row["mllog"]).parent / CLOCK
        try:
            seen.append(float(json.loads(beat.read_text())["clock"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no heartbeat (killed at once): the other readings stand
    return max(seen)


def _latest(row: dict[str, Any]) -> dict[str, Any] | None:
    """The run's last checkpoint, or the one it started from (a resumed run killed before its
    first own checkpoint), as {"file", "sha256", "epoch"}."""
    own = row["details"].get("checkpoints", [])
    if own:
        return own[-1]
    started = row["details"].get("resumed")
    if started:
        return {"file": started["checkpoint"], "sha256": started["sha256"],
                "epoch": started["epoch"], WHOLE: started.get(WHOLE)}
    return None


def plan(ledger: Any, run_id: int, workload: Any, entry: Any, backend: str,
         hyperparameters: dict[str, Any] | None = None, world_size: int = 1) -> Resumed:
    """Where `--resume RUN` starts, every check made (a UsageError naming what does not match,
    before anything is recorded); returns the checkpoint's state, read and checked. Level 3
    gives the `hyperparameters` its run logs (its global batch, its scheme) and its world size,
    which must be RUN's."""
    from d500.ledger.start import hash_files
    ledger.reap()  # a killed run's row is sealed as interrupted, its checkpoints with it
    row = ledger.get(run_id)
    if row["status"] == "running":
        raise _refuse(run_id, f"run {run_id} is still running (pid {row['pid']} on "
                              f"{row['host']})")
    lost = row["status"] == "failed" and row["details"].get("rank_lost")  # level 3: a rank died
    if row["status"] in FINISHED and not lost:
        raise _refuse(run_id, f"run {run_id} finished ({row['status']}); only a killed or "
                              f"interrupted run (level 3: or one whose rank died) can be resumed")
    theirs = {"level": row["level"], "workload": row["workload"],
              "submission": row["submission"], "backend": row["backend"]}
    ours = {"level": workload.level, "workload": workload.name, "submission": entry.name,
            "backend": backend}
    for key, value in theirs.items():
        if value != ours[key]:
            raise _refuse(run_id, f"run {run_id} is a run of {key} '{value}', not '{ours[key]}'")
    ran = row["world_size"] or 1
    if workload.level == 3 and ran != world_size:
        raise _refuse(run_id, f"run {run_id} ran at world size {ran}, not {world_size}: resume "
                              f"it at the same world size (mpiexec -n {ran})")
    if row["workload_sha256"] and workload.path is not None:
        from d500.ledger import integrity
        if integrity.sha256_file(workload.path) != row["workload_sha256"]:
            raise _refuse(run_id, f"{workload.path} changed since run {run_id} started")
    if hash_files(ledger, entry.files, "submission file") != row["submission_files"]:
        raise _refuse(run_id, f"the entry's files changed since run {run_id} started")
    if row["hyperparameters"] != (hyperparameters or entry.recipe.hyperparameters_logged()):
        raise _refuse(run_id, f"the recipe's hyperparameters are not run {run_id}'s")
    children = [r["id"] for r in ledger.runs(workload=workload.name)
                if r["parent"] == run_id and "resumed" in r["details"]]
    if children:
        raise _refuse(run_id, f"run {run_id} was already resumed by run {children[0]}; "
                              f"resume run {children[-1]} instead (one checkpoint continues "
                              f"once)")
    latest = _latest(row)
    if latest is None:
        raise _refuse(run_id, f"run {run_id} wrote no checkpoint (train with "
                              f"--checkpoint-every K)")
    path = ledger.resolve_path(latest["file"])
    t = time.perf_counter()  # reading the checkpoint is on the resumed run's clock
    try:
        state, meta = checkpoint.read(path, latest["sha256"])
    except checkpoint.CheckpointError as err:
        raise _refuse(run_id, str(err)) from None
    keys = ["workload", "submission", "backend", "seed"] + (
        ["world_size"] if workload.level == 3 else [])
    for key in keys:
        if meta.get(key) != row[key]:
            raise _refuse(run_id, f"{path} is a checkpoint of {key} '{meta.get(key)}', "
                                  f"not run {run_id}'s '{row[key]}'")
    before = _time(ledger, row)
    read = time.perf_counter() - t
    earlier = row["details"].get("resumed", {}).get("segments", [])
    segment = {"run": run_id, "status": row["status"], "until": before,
               "checkpoint_epoch": int(meta["epoch"])}
    return Resumed(run_id, path, latest["sha256"], state, meta, before + read,
                   [*earlier, segment], latest.get(WHOLE))
