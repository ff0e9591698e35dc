"""Completeness of a package's training results (pure functions over exported runs): the seeds and
studies a workload requires, seeds distinct, and every study's trial numbers present and finished.

    need = requirement(text, "2-training/digits-mlp.yaml", rules_dir)   # seeds, studies, trials
    seed_problems(seed_runs, need)        # duplicate seeds, too few distinct ones
    studies, problems = group_studies(runs, studies_json)   # {(level, workload, backend): ...}
    study_problems(studies[key], need)    # gaps, unfinished trials, too few complete studies

A result is one (level, workload, backend) of the entry, and at level 3 its seed runs count per
world size (d500 train chooses seeds per entry, workload, backend and N). Seed runs are the runs
outside any study that ended (not `running` or `interrupted`: d500.training.score counts them the
same way); a level-3 rank's own row is part of its group's run, not a result. A study's trials
count by number, every attempt of a number together (a resumed tuning re-runs an interrupted
trial as its next attempt): a number is done when one attempt ended in a final status.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.training.score import NOT_COUNTED  # statuses that are not a seed result
from d500.training.tuning import DONE  # a trial's final statuses (not run again on resume)

TRAINING_LEVELS = (2, 3)


def world(run: Any) -> int:
    """The run's world size (1 for a run of one process)."""
    return int(run.world_size or 1)


def is_rank_row(run: Any) -> bool:
    """A level-3 rank's own row beside its group's run (not a result of its own)."""
    return run.row.get("parent_run") is not None or (run.rank or 0) > 0


def is_seed_run(run: Any) -> bool:
    """A training run outside any study that ended: one of a result's seeds."""
    return (run.level in TRAINING_LEVELS and run.trial is None and not is_rank_row(run)
            and run.status not in NOT_COUNTED)


def result_name(level: int, workload: str, backend: str, ranks: int | None = None) -> str:
    """How a message names a result, e.g. "digits-mlp (level 3) / torch x2 ranks"."""
    at = f" x{ranks} ranks" if level == 3 and ranks is not None else ""
    return f"{workload} (level {level}) / {backend}{at}"


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def ids(values: Iterable[int]) -> str:
    """Run ids or trial numbers for a message: all of them, or the first 8 and the count."""
    values = list(values)
    shown = ", ".join(map(str, values[:8]))
    return shown if len(values) <= 8 else f"{shown}, … ({len(values)} in all)"


@dataclass(frozen=True)
class Requirement:
    """What a training workload asks of each entry: seeds, and studies of so many trials (none
    for a workload without `tuning:`: level 3)."""

    seeds: int
    studies: int
    trials: int


def requirement(text: bytes, where: str, folder: Path | None = None) -> Requirement:
    """A workload file's `seeds:` and `tuning:` as its level's own loader reads the file
    (d500.training.workloads, d500.distributed.workloads: the schema's defaults when absent,
    level 2 tuning 3 studies of 5 trials, level 3 having no `tuning:` and requiring no study).
    `where` names the file relative to the rules `folder`: when the folder holds it (the text is
    the rulebook's), the file is named by its path there and a `model.file` resolves beside it;
    else (the package's own copy) by `where`. A file that does not load (`tuning: 5`,
    `seeds: 0`, `tuning:` at level 3, an unknown field, ...) is a ConfigError naming the file
    and field."""
    from d500.distributed import workloads as level3
    from d500.training import workloads as level2
    from d500.workload import mapping
    path = Path(where)
    if folder is not None and (folder / where).resolve().is_relative_to(folder.resolve()) \
            and (folder / where).is_file():
        path = folder / where
    loader = level3.load if mapping(text, path).get("level") == 3 else level2.load
    loaded = loader(path, text=text)
    return Requirement(loaded.seeds, loaded.studies, loaded.trials)


def seed_problems(runs: list[Any], need: Requirement) -> list[str]:
    """Duplicate seeds among a result's seed runs, and too few distinct ones."""
    used: dict[Any, list[int]] = {}
    for run in runs:
        used.setdefault(run.seed, []).append(run.origin_id)
    out = []
    for seed, same in sorted(used.items(), key=lambda kv: str(kv[0])):
        if seed is None:
            out.append(f"run(s) {ids(same)} record no seed")
        elif len(same) > 1:
            out.append(f"seed {seed} is used by runs {ids(same)} (seeds must be distinct)")
    distinct = len([s for s in used if s is not None])
    if distinct < need.seeds:
        out.append(f"{distinct} distinct seed(s) among its seed runs; the workload requires "
                   f"{need.seeds}")
    return out


@dataclass
class StudyRuns:
    """One study of a result: its record (None when the package does not list it) and its
    trial runs by trial number (every attempt)."""

    id: int
    record: dict[str, Any] | None
    trials: dict[int, list[Any]] = field(default_factory=dict)

    def budget_trials(self) -> int | None:
        budget = _json((self.record or {}).get("budget")) or {}
        value = budget.get("trials") if isinstance(budget, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def group_studies(runs: list[Any], listed: list[dict[str, Any]]
                  ) -> tuple[dict[tuple[int, str, str], dict[int, StudyRuns]], list[str]]:
    """Every study of the package with its trial runs, keyed by the (level, workload, backend)
    its trial runs recorded (sealed; studies.json's own fields are not) or, for a study without
    one, by studies.json's; and the trial runs whose study the package does not list."""
    found: dict[int, StudyRuns] = {s["id"]: StudyRuns(s["id"], s) for s in listed}
    keys = {s["id"]: (s.get("level"), s.get("workload"), s.get("backend")) for s in listed}
    problems = []
    for run in runs:
        if run.trial is None:
            continue
        sid, number = run.trial[0], run.trial[1]
        if sid not in found:
            problems.append(f"run {run.origin_id} is trial {number} of study {sid}, which the "
                            f"package does not list")
            found[sid] = StudyRuns(sid, None)
        if not found[sid].trials:
            keys[sid] = (run.level, run.workload, run.backend)
        found[sid].trials.setdefault(number, []).append(run)
    out: dict[tuple[int, str, str], dict[int, StudyRuns]] = {}
    for sid, study in found.items():
        if keys[sid][0] in TRAINING_LEVELS:
            out.setdefault(keys[sid], {})[sid] = study
    return out, problems


def study_problems(studies: dict[int, StudyRuns], need: Requirement) -> list[str]:
    """Gaps in every study, and fewer complete studies than the workload's tuning requires."""
    out, complete = [], 0
    for sid, study in sorted(studies.items()):
        size = study.budget_trials()
        if size is None:
            size = max(study.trials, default=-1) + 1
            out.append(f"study {sid} records no trial budget (taken as {size})")
        missing = [n for n in range(size) if n not in study.trials]
        unfinished = [n for n in range(size) if n in study.trials and not any(
            r.status in DONE for r in study.trials[n])]
        extra = sorted(n for n in study.trials if not 0 <= n < size)
        if missing:
            out.append(f"study {sid}: trial(s) {ids(missing)} of 0..{size - 1} missing (a "
                       f"hidden trial is a gap)")
        if unfinished:
            out.append(f"study {sid}: trial(s) {ids(unfinished)} never finished (only "
                       f"interrupted or running attempts)")
        if extra:
            out.append(f"study {sid}: trial(s) {ids(extra)} outside its {size} trials")
        if size >= need.trials and not any(
                n not in study.trials or n in unfinished for n in range(need.trials)):
            complete += 1
    if complete < need.studies:
        out.append(f"{complete} of its {len(studies)} study(ies) hold the workload's "
                   f"{need.trials} trials, finished; its tuning requires {need.studies}")
    return out
