"""Starting a run, shared by the Ledger and the Relay: the arguments checked and the files read
once (RunFields), then each writer keeps the run its own way and the MLLOG opens alike."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from d500 import mllog as _mllog
from d500 import provenance as _provenance
from d500.errors import ConfigError
from d500.ledger import integrity
from d500.ledger.lifecycle import Run, Study, placement

R = TypeVar("R", bound=Run)


class PathStore(Protocol):
    def store_path(self, path: str | Path) -> str: ...


@dataclass(frozen=True)
class RunFields:
    """What a run records about itself before it runs, checked: its entry, where it stands
    among other runs (placement), the files it names read and hashed, and its provenance.
    Paths are as the writer stores them; `workload_path` is the workload file as given."""

    init_ms: float
    level: int | None
    workload: str
    submission: str
    backend: str | None
    seed: int | None
    hyperparameters: dict[str, Any]
    division: str
    workload_path: str | Path | None
    workload_file: str | None
    workload_text: str | None
    workload_sha256: str | None
    model_file: str | None
    model_sha256: str | None
    submission_files: dict[str, str]
    group: str | None
    rank: int | None
    world_size: int | None
    parent: int | None
    provenance: dict[str, Any]


def hash_files(store: PathStore, paths: Iterable[str | Path], what: str) -> dict[str, str]:
    """{stored path: sha256} of files and of every file under folders (no bytecode)."""
    found: dict[str, str] = {}
    for p in paths:
        p = Path(p)
        if p.is_dir():
            members = sorted(f for f in p.rglob("*") if f.is_file()
                             and "__pycache__" not in f.parts and f.suffix != ".pyc")
        elif p.is_file():
            members = [p]
        else:
            raise ConfigError(f"{p}: no such {what}")
        for f in members:
            found[store.store_path(f)] = integrity.sha256_file(f)
    return found


def prepare_run(store: PathStore, level: int | None, workload: str, submission: str,
                backend: str | None, seed: int | None, hyperparameters: dict[str, Any] | None,
                workload_file: str | Path | None, submission_files: Sequence[str | Path],
                model_file: str | Path | None, division: str, group: str | int | None,
                rank: int | None, world_size: int | None,
                parent: Run | int | None) -> RunFields:
    """A run's fields: placement checked, the workload file read (its rules checked, its bytes
    hashed), the submission files and the model file hashed, provenance collected."""
    from d500 import workload as _workload

    init_ms = time.time() * 1e3
    run_group, rank, world_size, parent_id = placement(group, rank, world_size, parent)
    workload_text = workload_sha = None
    if workload_file is not None:
        wpath = Path(workload_file)
        try:
            raw = wpath.read_bytes()
            workload_text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{wpath}: cannot read workload file: {err}") from None
        workload_sha = hashlib.sha256(raw).hexdigest()  # of the bytes, as verify hashes
        _workload.rules(workload_text, wpath)  # its metrics (and rank_by) are defined
    files = hash_files(store, submission_files, "submission file")
    model_sha = None
    if model_file is not None:
        if not Path(model_file).is_file():
            raise ConfigError(f"{model_file}: no such model file")
        model_sha = integrity.sha256_file(model_file)
    return RunFields(
        init_ms=init_ms, level=level, workload=workload, submission=submission,
        backend=backend, seed=seed, hyperparameters=hyperparameters or {}, division=division,
        workload_path=workload_file,
        workload_file=None if workload_file is None else store.store_path(workload_file),
        workload_text=workload_text, workload_sha256=workload_sha,
        model_file=None if model_file is None else store.store_path(model_file),
        model_sha256=model_sha, submission_files=files, group=run_group, rank=rank,
        world_size=world_size, parent=parent_id, provenance=_provenance.collect())


class RunStarter(Generic[R]):
    """`start_run` for a writer of runs (the Ledger, a Relay): it prepares the run's fields,
    hands them to the writer's `_open_run`, and opens the run's MLLOG."""

    store_path: Callable[[str | Path], str]  # the writer's own (Store's, Relay's)

    def _open_run(self, fields: RunFields, study: Study | int | None,
                  trial: int | None) -> R:
        """Keep the new run (a ledger row, a relay record) and return it, MLLOG not begun."""
        raise NotImplementedError

    def start_run(self, level: int | None, workload: str, submission: str, backend: str | None,
                  seed: int | None = None, hyperparameters: dict[str, Any] | None = None,
                  workload_file: str | Path | None = None,
                  submission_files: Sequence[str | Path] = (),
                  model_file: str | Path | None = None,
                  study: Study | int | None = None, trial: int | None = None,
                  division: str = _mllog.CLOSED, *, group: str | int | None = None,
                  rank: int | None = None, world_size: int | None = None,
                  parent: Run | int | None = None, begin: bool = True) -> R:
        """Start a `running` run and open its MLLOG (the Ledger inserts its row after sealing
        dead runs of this host; a Relay keeps its record in memory).

        `group` ties runs together (the ranks of one distributed run, a series over seeds),
        `rank` of `world_size` places a run among the processes of a group (None: one
        process), `parent` names the run this one derives from (a Run or a run id). With
        begin=False the MLLOG stays in its init interval until `run.begin()` (a trainer
        building its model first), as MLPerf's init_start/init_stop/run_start order it."""
        fields = prepare_run(self, level, workload, submission, backend, seed, hyperparameters,
                             workload_file, submission_files, model_file, division, group, rank,
                             world_size, parent)
        run = self._open_run(fields, study, trial)
        _mllog.begin_run(run.mllog, init_ms=fields.init_ms, benchmark=workload, org=submission,
                         platform=_provenance.summary(fields.provenance), division=division,
                         run_id=run.id, level=level, backend=backend, seed=seed,
                         hyperparameters=fields.hyperparameters,
                         distributed={"run_group": fields.group, "rank": fields.rank,
                                      "world_size": fields.world_size,
                                      "parent_run": fields.parent})
        if begin:
            run.begin()
        return run
