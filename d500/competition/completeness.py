"""Completeness of a package's training results (pure functions over exported runs): the seeds the
rules require, run to an end and distinct, studies of exactly the workload's budget with every
trial number present and finished, and no run hidden from the chain.

    need = requirement(text, "2-training/digits-mlp.yaml", rules_dir)   # seeds, studies, trials
    seed_problems(seed_runs, required)    # required seeds missing, only interrupted, repeated
    train_command(level, ranks)           # what runs them: mpiexec -n N d500 train at level 3
    explorations(seed_runs, required)     # the other seed runs: listed, never scored
    studies, problems = group_studies(runs, studies_json)   # {(level, workload, backend): ...}
    study_problems(studies[key], need)    # budget, gaps, unfinished and extra trials
    chain_gaps(chain_ids)                 # run ids the chain skips (deleted rows)

A result is one (level, workload, backend) of the entry, and at level 3 its seed runs count per
world size. Its required seeds are the rules' (d500.training.seeds: derived from workload, entry,
backend and, at level 3, N), never the sender's. A required seed counts when one of its runs ended
(not `running` or `interrupted`: d500.training.score counts them the same way); one only
interrupted is a miss until re-run. A level-3 rank's own row is part of its group's run, not a
result. A study's trials count by number, every attempt of a number together (a resumed tuning
re-runs an interrupted trial as its next attempt): a number is done when one attempt ended in a
final status, and no number ends twice (a study scores its fastest run, so a trial run again
after it ended would be a best of two).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.ledger.lifecycle import study_number
from d500.training.score import NOT_COUNTED  # statuses that are not a seed result
from d500.training.tuning import DONE  # a trial's final statuses (not run again on resume)
from d500.untrusted import json_value

TRAINING_LEVELS = (2, 3)


def world(run: Any) -> int:
    """The run's world size (1 for a run of one process)."""
    return int(run.world_size or 1)


def is_rank_row(run: Any) -> bool:
    """A level-3 rank's own row beside its group's run (not a result of its own)."""
    return run.row.get("parent_run") is not None or (run.rank or 0) > 0


def is_seed_run(run: Any) -> bool:
    """A training run outside any study that ended: one of a result's seeds."""
    return is_outside_study(run) and run.status not in NOT_COUNTED


def is_outside_study(run: Any) -> bool:
    """A training run outside any study (a seed run, or one interrupted), not a rank's row."""
    return run.level in TRAINING_LEVELS and run.trial is None and not is_rank_row(run)


def result_name(level: int, workload: str, backend: str, ranks: int | None = None) -> str:
    """How a message names a result, e.g. "digits-mlp (level 3) / torch x2 ranks"."""
    at = f" x{ranks} ranks" if level == 3 and ranks is not None else ""
    return f"{workload} (level {level}) / {backend}{at}"


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json_value(value)
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

    seeds: int  # every seed to run: M (`seed_runs:`, else `seeds:`)
    studies: int
    trials: int
    tuning_seed: int = 0


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
    return Requirement(loaded.seed_runs, loaded.studies, loaded.trials, loaded.tuning_seed)


def train_command(level: int, ranks: int) -> str:
    """The command that runs a result's seeds: `d500 train`, at level 3 under mpiexec at the
    result's world size."""
    return f"mpiexec -n {ranks} d500 train" if level == 3 else "d500 train"


def seed_problems(runs: list[Any], required: list[int], command: str = "d500 train"
                  ) -> list[str]:
    """A result's seed runs (every one outside a study, interrupted included) against its
    required seeds (d500.training.seeds.required): each required seed run to an end (only
    interrupted: a miss until re-run), and no required seed run to an end twice; `command`
    runs them (level 3: under mpiexec at the result's world size)."""
    ended = [r for r in runs if r.status not in NOT_COUNTED]
    used: dict[Any, list[int]] = {}
    for run in ended:
        used.setdefault(run.seed, []).append(run.origin_id)
    out = []
    for seed, same in sorted(used.items(), key=lambda kv: str(kv[0])):
        if seed is None:
            out.append(f"run(s) {ids(same)} record no seed")
        elif len(same) > 1 and seed in required:
            out.append(f"seed {seed} is used by runs {ids(same)} (seeds must be distinct)")
    missing = [s for s in required if s not in used]
    cut = {s: [r.origin_id for r in runs if r.seed == s and r.status == "interrupted"]
           for s in missing}
    never = [s for s in missing if not cut[s]]
    of = f"of the workload's {len(required)}"
    if never:
        out.append(f"required seed(s) {ids(never)} ({of}) have no run: the rules choose the "
                   f"seeds (`{command}` without --seed runs them)")
    for s in (s for s in missing if cut[s]):
        out.append(f"required seed {s} ({of}) only interrupted (run(s) {ids(cut[s])}): a miss "
                   f"until re-run to completion (`{command}` without --seed runs it again)")
    return out


def explorations(runs: list[Any], required: list[int]) -> list[Any]:
    """A result's seed runs whose seed the rules did not choose: listed, never scored."""
    return [r for r in runs if r.seed not in required]


@dataclass
class StudyRuns:
    """One study of a result: its record (None when the package does not list it) and its
    trial runs by trial number (every attempt)."""

    id: int
    record: dict[str, Any] | None
    trials: dict[int, list[Any]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The study as `d500 tune`, `d500 ledger list` and `d500 reproduce` name it: its number
        in the entry's tuning (from 0, as its trials), else its origin id."""
        number = study_number((self.record or {}).get("name"))
        return f"study {number}" if number is not None else f"study id {self.id}"


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


def study_problems(studies: dict[int, StudyRuns], need: Requirement,
                   backend: str | None = None) -> list[str]:
    """Every study against the workload's exact budget (its recorded budget the workload's, its
    trial numbers 0..T-1, none beyond), gaps and unfinished trials, and fewer complete studies
    than the workload's tuning requires."""
    out, complete = [], 0
    size = need.trials
    if not studies and need.studies:
        return [f"seed runs on this backend but no tuning here: every backend an entry has "
                f"seed runs on needs the workload's full tuning on it too, {need.studies} "
                f"studies of {need.trials} trials (`d500 tune` with "
                f"{f'--backend {backend}' if backend else 'that backend'} runs them)"]
    for _, study in sorted(studies.items()):
        sid = study.label
        recorded = budget(study)
        if recorded != (need.studies, need.trials):
            what = ("no budget" if recorded is None else
                    f"a budget of {recorded[0]} studies of {recorded[1]} trials")
            out.append(f"{sid} records {what}; the workload's tuning is {need.studies} "
                       f"studies of {need.trials} trials (d500 tune without --studies/--trials)")
        missing = [n for n in range(size) if n not in study.trials]
        unfinished = [n for n in range(size) if n in study.trials and not any(
            r.status in DONE for r in study.trials[n])]
        extra = sorted(n for n in study.trials if not 0 <= n < size)
        twice = sorted(n for n in range(size) if n in study.trials
                       and sum(r.status in DONE for r in study.trials[n]) > 1)
        if missing:
            out.append(f"{sid}: trial(s) {ids(missing)} of 0..{size - 1} missing (a "
                       f"hidden trial is a gap)")
        if unfinished:
            out.append(f"{sid}: trial(s) {ids(unfinished)} never finished (only "
                       f"interrupted or running attempts)")
        if extra:
            out.append(f"{sid}: trial(s) {ids(extra)} beyond the workload's {size} trials "
                       f"per study (only trials 0..{size - 1} may run and score)")
        if twice:
            out.append(f"{sid}: trial(s) {ids(twice)} ran to an end more than once (a trial "
                       f"runs once: a resumed tuning re-runs only an interrupted one, and the "
                       f"study scores its fastest run)")
        if not missing and not unfinished:
            complete += 1
    if complete < need.studies:
        out.append(f"{complete} of its {len(studies)} study(ies) hold the workload's "
                   f"{need.trials} trials, finished; its tuning requires {need.studies}")
    return out


def budget(study: StudyRuns) -> tuple[int, int] | None:
    """A study's recorded budget (studies, trials), None when it records none readable."""
    value = _json((study.record or {}).get("budget")) or {}
    found = tuple(value.get(k) for k in ("studies", "trials")) if isinstance(value, dict) else ()
    ok = len(found) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in found)
    return found if ok else None  # type: ignore[return-value]


def chain_gaps(chain_ids: Iterable[int]) -> list[int]:
    """Run ids from 1 (a ledger's first) to the chain's last that the chain skips: a row deleted
    from the ledger and the chain re-linked, or a run not yet sealed when it was packaged."""
    have = set(chain_ids)
    return [i for i in range(1, max(have, default=0) + 1) if i not in have]
