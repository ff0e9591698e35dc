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
from d500.training.trainer import Progress, Result, preflight, train
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
    world_size: int = 1  # processes that ran trials (MPI ranks)
    ranks: dict[tuple[int, int], int] = field(default_factory=dict)  # (study, trial) -> rank


def plan(workload: Workload, submission: Submission, studies: int, trials: int
         ) -> list[list[Trial]]:
    """Every study's trials, drawn now (a bad search space fails before anything runs)."""
    out = []
    for s in range(studies):
        points = submission.trials(trials, seed_of("study", workload.tuning_seed, s))
        submission.validate(points)  # an entry's own optimizer: one child process for all
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


@dataclass
class Opened:
    """A study of this tuning as the ledger holds it: the Study, and its trials already done
    (number -> the done run), which a resumed tuning keeps."""

    study: Any
    done: dict[int, dict[str, Any]]


def open_studies(ledger: Any, workload: Workload, submission: Submission, backend: str,
                 studies: int, trials: int) -> list[Opened]:
    """Every study opened (or reopened, to resume it) in the ledger, with its done trials."""
    out = []
    for s in range(studies):
        name = study_name(workload, submission, backend, s, studies, trials)
        study = ledger.open_study(name, level=workload.level, workload=workload.name,
                                  submission=submission.name, backend=backend,
                                  objective=workload.rank_by,
                                  search_space=submission.search_space or {
                                      "feasible_points": submission.feasible_points},
                                  budget={"studies": studies, "trials": trials})
        done = {t["number"]: t["run"] for t in ledger.trials(study.id)
                if t["run"]["status"] in DONE}
        out.append(Opened(study, done))
    return out


def run_trial(workload: Workload, submission: Submission, backend: str, trial: Trial,
              study: Any, *, ledger: Any, data_dir: str | None = None,
              progress: Progress | None = None,
              run_kwargs: dict[str, Any] | None = None) -> Result:
    """Train one trial as a run of its study (a Study, or a study id for a Relay)."""
    return train(workload, submission.recipe_with(trial.params), backend, trial.seed,
                 ledger=ledger, data_dir=data_dir, submission=submission.name,
                 submission_files=submission.files, study=study, trial=trial.number,
                 progress=progress, run_kwargs=run_kwargs)


def tune(workload: Workload, submission: Submission, backend: str, *, studies: int,
         trials: int, ledger: Any = None, data_dir: str | None = None,
         on_trial: Callable[[Trial], Progress | None] | None = None) -> TuneReport:
    """Run (or resume) the studies in this process; `on_trial` gives a progress callback per
    trial. (d500.training.tune_parallel shares the trials among MPI ranks.)"""
    from d500.ledger import Ledger

    schedule = plan(workload, submission, studies, trials)
    preflight(workload, submission.recipe, backend, data_dir)  # bad input: no study opened
    ledger = ledger if ledger is not None else Ledger()
    report = TuneReport()
    for study_trials, opened in zip(schedule, open_studies(ledger, workload, submission,
                                                           backend, studies, trials)):
        report.studies.append(opened.study.id)
        for trial in study_trials:
            if trial.number in opened.done:
                report.kept.append((trial, opened.done[trial.number]))
                continue
            result = run_trial(workload, submission, backend, trial, opened.study,
                               ledger=ledger, data_dir=data_dir,
                               progress=on_trial(trial) if on_trial else None)
            report.ran.append((trial, result))
        opened.study.finish("succeeded")
    return report
