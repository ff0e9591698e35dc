"""Level-2 scoring from ledger rows alone (pure functions): AlgoPerf's study score, the
tuning-inclusive cost and statistics over seeds.

- a study scores its fastest trial's time to the target (infinity when no trial met it);
- an entry (workload, submission, backend) scores the median over its studies;
- its tuning cost is the wall time of every trial of every study, failed and missed included;
- over seeds: median, MLPerf's olympic mean and a bootstrap 95% confidence interval of the
  median, never the best run, over the required seeds only (d500.training.seeds: an interrupted
  required seed is a miss until re-run; a run with any other seed is an exploration, listed and
  never scored), or over the seeds the organiser drew where it re-ran the result at N or more
  (`d500 reproduce --fresh-seeds`: the entry's own seed runs are then listed, `seeds_note`);
- a study's trials 0..T-1 only (T its workload's `tuning: trials`) ever score;
- the performance profile over workloads is d500.profile's (shared with levels 0 and 1);
- times are compared on one machine only: `by_machine` splits runs by their hardware
  (d500.leaderboard.environments.machine), and the views score each part apart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d500.metrics import aggregate
from d500.training import seeds

NOT_COUNTED = ("interrupted", "running")


def to_target(run: dict[str, Any], name: str) -> float:
    """A run's figure `name` measured to the target (time_to_accuracy, epochs, steps): infinity
    unless it succeeded and recorded it."""
    if run["status"] != "succeeded":
        return math.inf
    value = run["figures"].get(name)
    return math.inf if value is None else float(value)


def time_to_target(run: dict[str, Any]) -> float:
    """A run's time to the target: infinity unless it succeeded."""
    return to_target(run, "time_to_accuracy")


def wall_time(run: dict[str, Any]) -> float:
    """Seconds the run took, start to stop (0 for one still running)."""
    return max(0.0, (run.get("stopped_unix") or run["started_unix"]) - run["started_unix"])


def test_name(run: dict[str, Any]) -> str:
    """The figure holding a run's test quality: test_accuracy, or test_log_perplexity for a
    language model (by the target metric its details record)."""
    from d500.training.workloads import QUALITIES
    target = run.get("details", {}).get("target_metric", "val_accuracy")
    return f"test_{QUALITIES.get(target, 'accuracy')}"


@dataclass
class Entry:
    """One (workload, submission, backend) with its studies and seed runs."""

    workload: str
    submission: str
    backend: str
    studies: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # id -> trial runs
    seeds: list[dict[str, Any]] = field(default_factory=list)  # the required seeds' runs
    explorations: list[dict[str, Any]] = field(default_factory=list)  # other seed runs
    unscored: list[dict[str, Any]] = field(default_factory=list)  # run, outside the M > N window
    choice: seeds.Choice | None = None  # the M > N window that scores (None: M = N)
    reproduction: bool = False  # `d500 reproduce` runs: shown beside their package, unranked
    name: str = ""  # the submission's own name (`submission` is its label on the boards)
    drawn: bool = False  # the organiser's fresh-seed reproductions: they score the result
    seeds_note: str = ""  # why its seeds do not score it (the organiser's seeds do), or ""
    package: str = ""  # the sha256 of the package its runs came from (or reproduce), else ""
    copy_of: str = ""  # the entry of another name whose code its package's is (same_code)

    @property
    def trials(self) -> list[dict[str, Any]]:
        return [r for runs in self.studies.values() for r in runs]

    def study_scores(self) -> list[float]:
        return [min((time_to_target(r) for r in runs), default=math.inf)
                for runs in self.studies.values()]

    @property
    def score(self) -> float | None:
        """Median over studies of each study's fastest trial (None without studies)."""
        scores = self.study_scores()
        return float(statistics.median(scores)) if scores else None

    @property
    def tuning_cost(self) -> float:
        return sum(wall_time(r) for r in self.trials)

    def test_quality(self) -> float | None:
        """Test quality (test_name) at the target of each study's fastest trial, median over
        studies."""
        values = []
        for runs in self.studies.values():
            best = min(runs, key=time_to_target, default=None)
            if best is not None and math.isfinite(time_to_target(best)):
                values.append(best["figures"].get(test_name(best)))
        values = [v for v in values if v is not None]
        return float(statistics.median(values)) if values else None

    def rcp(self) -> Any:
        """The RCP normalization of its scored seed runs (rcp_of)."""
        return rcp_of(self.seeds)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.trials:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def entries(runs: Iterable[dict[str, Any]], copies: Mapping[str, Any] | None = None
            ) -> list[Entry]:
    """Group level-2/3 runs into entries: tuning trials by study, the other runs as seeds.
    `copies` ({package sha256: d500.competition.same_code.Copy}): entries of a package whose
    code an entry of another name brought first are that entry's copies, never scored."""
    from d500.leaderboard.ranking import origin, submission_label
    from d500.training.precision import precision_of

    found: dict[tuple[str, str, str], Entry] = {}
    outside: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:  # a package's runs and reproductions apart from the ledger's own
        source = origin(r)
        low = precision_of(r)  # another precision than fp32 is another entry, named so
        key = (r["workload"] or "", submission_label(r["submission"] or "", source),
               (r["backend"] or "") + ("" if low == "fp32" else f" · {low}"))
        entry = found.setdefault(key, Entry(*key, reproduction=bool(
            source and source.get("reproduction")), name=r["submission"] or "",
            drawn=bool(source and source.get("drawn")),
            package=(source or {}).get("sha256") or ""))
        study = r.get("study")
        if study is None:
            outside.setdefault(key, []).append(r)
        elif in_budget(r):
            entry.studies.setdefault(study, []).append(r)
    for key, seed_runs in outside.items():
        out = seeds.sort_out(seed_runs, own_draws=True)
        found[key].seeds, found[key].explorations = out.scored, out.explorations
        found[key].unscored, found[key].choice = out.unscored, out.choice
    _seeds_notes(list(found.values()))
    for e in found.values():
        copy = (copies or {}).get(e.package)
        if copy is not None and not e.reproduction:
            e.copy_of = copy.entry
            e.seeds_note = f"its code is entry {copy.entry}'s (package {copy.sha256[:8]}): unranked"
    # a package's rows and their reproductions side by side, per backend
    return sorted(found.values(), key=lambda e: (e.workload, e.name, e.backend,
                                                 e.reproduction, e.submission))


def _seeds_notes(entries: list[Entry]) -> None:
    """As the workload's board (d500.leaderboard.ranking): a result the organiser scored at N or
    more seeds it drew makes its entry's own seed runs unscored, and every other entry's of that
    workload scored on seeds known before its runs; too few drawn seeds score nothing."""
    scoring_rows = set()
    for e in (e for e in entries if e.drawn):
        first = e.seeds[0] if e.seeds else {}
        need = seeds.scoring(first.get("workload_text"), first.get("workload_file")) or 1
        if len(e.seeds) < need:
            e.seeds_note = f"{len(e.seeds)} of {need} drawn seeds"
        else:
            scoring_rows.add((e.workload, e.name, e.backend))
    for e in entries:
        if e.drawn or e.reproduction or not e.seeds or not any(
                w == e.workload for w, _, _ in scoring_rows):
            continue
        e.seeds_note = ("its own seeds; the organiser's score it"
                        if (e.workload, e.name, e.backend) in scoring_rows
                        else "its seeds were known before its runs: unranked beside rows at the "
                             "organiser's seeds")


def rcp_of(scored: list[dict[str, Any]]) -> Any:
    """The RCP normalization (d500.competition.convergence.Scale) of one result's scored seed
    runs, against the reference convergence its recorded workload holds: factor 1 without one."""
    from d500.competition import convergence
    from d500.errors import D500Error
    from d500.training.precision import precision_of
    if not scored:
        return convergence.Scale(1.0, "no scored seed runs: not scaled")
    first, low = scored[0], precision_of(scored[0])
    try:
        rules = convergence.read(first.get("workload_text") or "",
                                 first.get("workload_file") or "workload.yaml")
    except D500Error as err:
        return convergence.Scale(1.0, f"its reference convergence is unreadable ({err}): "
                                      f"not scaled")
    ref = rules.reference_in(low) or rules.reference  # another precision's: says it has none
    metric = ref.metric if ref is not None else "epochs"
    done = [to_target(r, metric) for r in scored if r["status"] == "succeeded"]
    verdict = convergence.check_epochs(ref, done, precision=low)
    return convergence.rcp_scale(ref, [to_target(r, metric) for r in scored], precision=low,
                                 verdict=verdict)


def scaled(scored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scored seed runs with their time to accuracy multiplied by rcp_of's factor (copies;
    the ledger's rows are untouched)."""
    factor = rcp_of(scored).factor
    if factor == 1.0:
        return scored
    return [{**r, "figures": {**r["figures"], "time_to_accuracy":
                              r["figures"]["time_to_accuracy"] * factor}}
            if r["figures"].get("time_to_accuracy") is not None else r for r in scored]


def in_budget(run: dict[str, Any]) -> bool:
    """Whether a trial run's number is within its workload's `tuning: trials` (trials 0..T-1
    score; its recorded rules unreadable: counted)."""
    trials = seeds.tuning_trials(run.get("workload_text"), run.get("workload_file"))
    number = run.get("trial")
    return trials is None or number is None or 0 <= number < trials


def by_machine(runs: Iterable[dict[str, Any]], environments: Mapping[int, Any],
               order: Iterable[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by the hardware key of the environment each recorded (`environments`: the
    ledger's, id -> provenance); machines in `order` first, then as the runs show them."""
    from d500.leaderboard.environments import machine

    groups: dict[str, list[dict[str, Any]]] = {key: [] for key in order}
    for r in runs:
        groups.setdefault(machine(environments.get(r["environment"])), []).append(r)
    return {key: group for key, group in groups.items() if group}


@dataclass
class SeedStats:
    n: int
    median: float | None
    olympic_mean: float | None
    ci95: tuple[float, float] | None


def over_seeds(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> SeedStats:
    """Median, olympic mean and a percentile-bootstrap 95% CI of the median (inf allowed)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return SeedStats(0, None, None, None)
    ci = None
    if len(vals) >= 2:
        rng = np.random.default_rng(seed)
        data = np.asarray(vals, dtype=np.float64)
        medians = np.median(rng.choice(data, size=(resamples, len(data))), axis=1)
        # order statistics, not interpolation: an infinite median (misses) stays infinite
        ci = (float(np.percentile(medians, 2.5, method="lower")),
              float(np.percentile(medians, 97.5, method="higher")))
    return SeedStats(len(vals), aggregate(vals, "median"), aggregate(vals, "olympic_mean"), ci)
