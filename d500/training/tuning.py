"""AlgoPerf-style external tuning: S studies of T trials drawn quasi-randomly from the
submission's search space; every trial a ledger run (failed, diverged and missed included);
resumable (a killed tuning picks up where it stopped, re-running only the interrupted trial).

Each study's trial points come from a scrambled Halton sequence seeded by the workload's
organiser seed and the study's number, and each trial trains with its own seed, so a rerun of
the same command draws the same trials. The score (d500.training.score) is the median over
studies of each study's fastest trial to the target; its cost is the wall time of every trial.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from d500.training.submission import Submission
from d500.training.trainer import Progress, Result, train
from d500.training.workloads import Workload

DONE = ("succeeded", "missed", "diverged", "failed", "timeout")  # a trial not to run again


def seed_of(*key: Any) -> int:
    """A 31-bit seed from a key (stable across machines and Python versions)."""
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass
class Trial:
    study: int
    number: int
    params: dict[str, Any]
    seed: int


@dataclass
class TuneReport:
    """What a tuning command did: the trials run now, those found done, per study."""

    ran: list[tuple[Trial, Result]] = field(default_factory=list)
    kept: list[tuple[Trial, dict[str, Any]]] = field(default_factory=list)
    studies: list[int] = field(default_factory=list)  # ledger study ids


def plan(workload: Workload, submission: Submission, studies: int, trials: int
         ) -> list[list[Trial]]:
    """Every study's trials, drawn now (a bad search space fails before anything runs)."""
    out = []
    for s in range(studies):
        points = submission.trials(trials, seed_of("study", workload.tuning_seed, s))
        for params in points:
            submission.recipe_with(params).check(workload)
        out.append([Trial(s, t, params, seed_of("trial", workload.tuning_seed, s, t))
                    for t, params in enumerate(points)])
    return out


def study_name(workload: Workload, submission: Submission, backend: str, study: int,
               studies: int, trials: int) -> str:
    """The key a resumed tuning finds its study by: the same rules, entry, backend and shape."""
    from d500.ledger import sha256_file
    files = [workload.path, *submission.files]
    digest = hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()[:16]
    return (f"{workload.name} / {submission.name} / {backend}: study {study + 1} of {studies}, "
            f"{trials} trials, tuning seed {workload.tuning_seed}, files {digest}")


def tune(workload: Workload, submission: Submission, backend: str, *, studies: int,
         trials: int, ledger: Any = None, data_dir: str | None = None,
         on_trial: Callable[[Trial], Progress | None] | None = None,
         only: Callable[[Trial], bool] | None = None) -> TuneReport:
    """Run (or resume) the studies; `only` restricts which trials this process runs (MPI
    ranks split them), `on_trial` gives a progress callback per trial."""
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    schedule = plan(workload, submission, studies, trials)
    report = TuneReport()
    for s, study_trials in enumerate(schedule):
        name = study_name(workload, submission, backend, s, studies, trials)
        study = ledger.open_study(name, level=workload.level, workload=workload.name,
                                  submission=submission.name, backend=backend,
                                  objective=workload.rank_by,
                                  search_space=submission.search_space or {
                                      "feasible_points": submission.feasible_points},
                                  budget={"studies": studies, "trials": trials})
        report.studies.append(study.id)
        done = {t["number"]: t for t in ledger.trials(study.id)
                if t["run"]["status"] in DONE}
        for trial in study_trials:
            if trial.number in done:
                report.kept.append((trial, done[trial.number]["run"]))
                continue
            if only is not None and not only(trial):
                continue
            result = train(workload, submission.recipe_with(trial.params), backend, trial.seed,
                           ledger=ledger, data_dir=data_dir, submission=submission.name,
                           submission_files=submission.files, study=study, trial=trial.number,
                           progress=on_trial(trial) if on_trial else None)
            report.ran.append((trial, result))
        if all(t.number in done or any(r[0] is t for r in report.ran) for t in study_trials):
            study.finish("succeeded")
    return report
