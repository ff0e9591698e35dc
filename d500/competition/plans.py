"""Every packaged study's trials against the Halton plan the rules draw (d500.training.tuning.plan):
each trial's parameters and seed must be the ones its number gets from the workload's organiser
seed and the packaged entry's search space, so trials cannot be renumbered, re-drawn or picked.

    entry = packaged_entry(pkg)                   # the packaged submission.yaml, no code run
    plan_problems(studies, need, entry)           # one line per study whose trials do not fit

The entry's optimizer file is never imported (d500 check runs no entry code): the plan needs only
the search space or feasible points of its submission.yaml. A study's place in the plan (study k
of S) is found from its trials' seeds, else from its recorded name; two studies at one place are a
study run twice.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from d500.competition.completeness import Requirement, StudyRuns, ids
from d500.errors import D500Error
from d500.ledger.lifecycle import study_number


def packaged_entry(pkg: Any) -> Any:
    """The packaged submission.yaml read as an entry whose trials() draws the plan (its recipe
    not built: no entry code runs); a ConfigError names the file and field."""
    from d500.errors import ConfigError
    from d500.training import submission
    from d500.workload import load
    where = f"{pkg.path}: files/submission/submission.yaml"
    text = pkg.submission_files().get("submission.yaml")
    if text is None:
        raise ConfigError(f"{where}: not in the package")
    data = load(where, submission.SCHEMA, text=text)
    names = dict.fromkeys(data["search_space"])  # any key: the entry's hyperparameters unknown
    stand_in = SimpleNamespace(hp=lambda: names, optimizer_name=data["optimizer"],
                               make_optimizer=lambda: SimpleNamespace(hp=names))
    space = {k: submission._check_dimension(where, k, v, stand_in)
             for k, v in data["search_space"].items()}
    return submission.Submission(path=where, name=data["name"], level=data["level"],
                                 workloads=list(data["workloads"]), recipe=None,
                                 search_space=space,
                                 feasible_points=[dict(p) for p in data["feasible_points"]])


def plan_problems(studies: dict[int, StudyRuns], need: Requirement, entry: Any) -> list[str]:
    """Each study's trials 0..T-1 against their place in the plan: parameters and seed."""
    from d500.training.tuning import seed_of
    if not studies or need.studies < 1:
        return []
    try:
        points = [entry.trials(need.trials, seed_of("study", need.tuning_seed, s))
                  for s in range(need.studies)]
    except D500Error as err:
        return [f"the tuning plan cannot be drawn: {err}"]
    seeds = [[seed_of("trial", need.tuning_seed, s, t) for t in range(need.trials)]
             for s in range(need.studies)]
    out, places = [], {}
    for _, study in sorted(studies.items()):
        place = _place(study, seeds)
        if place is None:
            out.append(f"{study.label}: neither its trials' seeds nor its name place it among the "
                       f"workload's {need.studies} studies (tuning seed {need.tuning_seed})")
            continue
        places.setdefault(place, []).append(study.label)
        wrong = sorted({n for n, runs in study.trials.items() if 0 <= n < need.trials
                        for r in runs if not _fits(r, points[place][n], seeds[place][n])})
        if wrong:
            out.append(f"{study.label}: trial(s) {ids(wrong)} do not hold the parameters and "
                       f"seed that study {place}'s Halton plan draws for their numbers (tuning "
                       f"seed {need.tuning_seed}): trials renumbered, re-drawn or edited")
    for place, labels in sorted(places.items()):
        if len(labels) > 1:
            out.append(f"{', '.join(labels)} are all study {place} of the plan (a study run "
                       f"more than once)")
    return out


def _place(study: StudyRuns, seeds: list[list[int]]) -> int | None:
    """A study's index in the plan: the one its trials' seeds belong to, else its name's."""
    for n, runs in sorted(study.trials.items()):
        for r in runs:
            found = [s for s, row in enumerate(seeds) if 0 <= n < len(row) and row[n] == r.seed]
            if found:
                return found[0]
    place = study_number(str((study.record or {}).get("name") or ""))
    return place if place is not None and 0 <= place < len(seeds) else None


def _fits(run: Any, params: dict[str, Any], seed: int) -> bool:
    """Whether a trial run holds its seed and its planned parameters, in its trial record and
    its hyperparameters (which name `schedule.name` schedule and `schedule.x` schedule_x, as
    d500.training.recipe records them)."""
    if run.seed != seed:
        return False
    recorded, hyper = run.params or {}, run.hyperparameters
    for key, value in params.items():
        name = ("schedule" if key == "schedule.name" else
                f"schedule_{key[len('schedule.'):]}" if key.startswith("schedule.") else key)
        if not all(name in held and _same(held[name], value) for held in (recorded, hyper)):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b
