"""The package checker (MLPerf's package_checker for d500): an opened package checked for
completeness, the rules, integrity, its logs and plausible convergence; one line per problem.

    from d500.competition.check import check, check_package
    problems = check_package(pkg, rules_dir=None, trusted=[])   # [] when the package passes
    report = check(pkg, rules_dir, trusted)   # .problems, .checked, .not_checked, .runs, ...

- completeness: per level-2/3 workload x backend the entry entered (and world size, at level 3),
  every seed the rules require (d500.training.seeds) run to an end (one only interrupted is a
  miss), once; the other seed runs listed as explorations, not scored; as many studies as its
  `tuning: {studies, trials}` requires (level 3 has none), each recording exactly that budget,
  each trial number 0..trials-1 present and finished (a hidden trial is a gap) and none beyond,
  every trial holding the parameters and seed its number draws from the Halton plan
  (d500.competition.plans); no run id skipped by the packaged chain (a deleted row); levels
  0/1 require none;
- rules: every workload file in the package byte for byte (sha256) the rulebook's (levels/, or
  `rules_dir` laid out like it), and each run's recorded workload text the packaged file's;
- integrity: the member hashes, each run's seal and row hash along the package's chain, its
  MLLOG and workload file the ones it sealed (Package.member_problems and chain_problems), the
  submission files each run recorded packed with that content (submission_problems), the
  runs belonging to the entry the manifest names (or ranks of its level-3 runs), the signature
  when there is one, and its signer among `trusted` when that is given;
- logs: each MLLOG accepted by MLPerf's compliance checker (d500.competition.compliance);
- consistency: each run's figures, evaluations, hyperparameters, seed, status and times against
  its own MLLOG (d500.competition.consistency), for the runs whose record and log pass integrity;
- convergence: each result's succeeded required seed runs against the workload's reference
  (d500.competition.convergence), every succeeded run's test accuracy against its
  validation accuracy, and each study's best trial against the reference runs at its
  hyperparameters that the organiser recorded beside the workload file
  (d500.competition.trial_reference: `d500 reference --trials PACKAGE`);
- identity: each MLLOG's platform line against its run's provenance, and the d500 version and
  commit the runs were made with against this one's (notes: problems only under --strict;
  d500.competition.identity).

What could not be checked (no reference for a workload or a trial's point, mlperf_logging
missing) is reported apart, so a pass says exactly what it covered.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.competition.completeness import (
    TRAINING_LEVELS,
    chain_gaps,
    explorations,
    group_studies,
    ids,
    is_outside_study,
    is_rank_row,
    is_seed_run,
    requirement,
    result_name,
    seed_problems,
    study_problems,
    train_command,
    world,
)
from d500.errors import D500Error


@dataclass
class Report:
    """What `check` found: problems (one line each; none: passed), what it checked and what it
    could not, and the package's counts."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings: problems only under --strict
    not_scored: list[str] = field(default_factory=list)  # explorations: listed, not a problem
    scoring: list[dict[str, Any]] = field(default_factory=list)  # d500.competition.scoring
    runs: int = 0
    studies: int = 0
    seeds: int = 0  # seed runs (runs outside any study) at levels 2 and 3

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass
class Context:
    """One check's inputs: the package, its runs and studies, the rulebook folder."""

    pkg: Any
    runs: list[Any]
    studies: list[dict[str, Any]]
    rules_dir: Path
    trusted: tuple[str, ...]
    explorations: set[int] = field(default_factory=set)  # seed runs not scored (completeness)

    def rulebook_text(self, rel: str) -> bytes | None:
        """A file of the rulebook folder (None: not there, or `rel` leads outside it)."""
        root = self.rules_dir.resolve()
        path = (root / rel).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
        return path.read_bytes()

    def rules_text(self, rel: str) -> bytes | None:
        """A workload's rules (`rel` under levels/): the rulebook's file (what the organiser
        holds), else the package's copy (the rules check says it is not the rulebook's)."""
        text = self.rulebook_text(rel)
        return text if text is not None else self.pkg.workload_files().get(rel)


def check_package(pkg: Any, rules_dir: Path | None = None, trusted: Sequence[str] = ()
                  ) -> list[str]:
    """The problems of an opened package (d500.competition.package.Package), one line each."""
    return check(pkg, rules_dir, trusted).problems


def check(pkg: Any, rules_dir: Path | None = None, trusted: Sequence[str] = ()) -> Report:
    """Every check on an opened package; `rules_dir` defaults to d500's rulebook (levels/),
    `trusted` holds the hex ed25519 public keys whose signature is accepted (empty: any)."""
    from d500.paths import rulebook
    rules_dir = Path(rules_dir) if rules_dir is not None else rulebook()
    trusted = tuple(k.lower() for k in trusted)
    try:
        runs = pkg.runs()
        studies = list(pkg.studies())
    except D500Error as err:  # a run record or studies.json that cannot be read
        report = Report()
        report.problems += [f"integrity: {p}" for p in pkg.member_problems()]
        report.problems.append(f"integrity: {err}")
        report.not_checked.append("rules, completeness, logs, consistency, convergence: the "
                                  "runs could not be read")
        return report
    ctx = Context(pkg, sorted(runs, key=lambda r: r.origin_id), studies, rules_dir, trusted)
    report = Report(runs=len(runs), studies=len(studies),
                    seeds=sum(1 for r in runs if is_seed_run(r)))
    from d500.competition import scoring
    from d500.competition.identity import check_identity
    for step in (check_integrity, check_rules, check_completeness, check_logs,
                 check_consistency, check_restarts, check_convergence, check_identity,
                 scoring.check):
        step(ctx, report)
    return report


# -- what a run is ----------------------------------------------------------------------------

def workload_member(level: int, workload: str) -> str:
    """A workload file's path under files/workloads/ (and under the rulebook folder)."""
    return f"{level_folder(level)}/{workload}.yaml"


def _is_text(ctx: Any, run: Any) -> bool:
    """Whether a run's workload (the text it recorded, else the rules' file) is a language model,
    whose MLLOG must state attention's precision; a workload that does not parse reads as not
    (the consistency step names it)."""
    from d500.competition.consistency import rules
    text = run.row.get("workload_text")
    rel = run_workload(run, ctx.pkg.workload_files())
    try:
        return rules(text if text is not None else ctx.rules_text(rel), rel).text
    except D500Error:
        return False


def run_workload(run: Any, files: dict[str, bytes]) -> str:
    """The path under files/workloads/ of the workload file a run ran under: its record's
    `workload_file` when that names one of the packaged `files` (pkg.workload_files()), else
    the one its level and workload name (run_workload_problem says why its record's is not)."""
    from d500.competition.layout import WORKLOAD_FILES
    member = run.workload_member or ""
    if member.startswith(WORKLOAD_FILES) and member[len(WORKLOAD_FILES):] in files:
        return member[len(WORKLOAD_FILES):]
    return workload_member(run.level, run.workload)


def run_workload_problem(run: Any, files: dict[str, bytes]) -> str | None:
    """Why a run record's `workload_file` (not sealed) names no packaged workload file."""
    from d500.competition.layout import WORKLOAD_FILES
    member = run.workload_member
    if member is None or (member.startswith(WORKLOAD_FILES)
                          and member[len(WORKLOAD_FILES):] in files):
        return None
    return (f"run {run.origin_id}: its record's workload_file {member!r} is not a workload "
            "file of the package")


def level_folder(level: int) -> str:
    from d500 import levels
    try:
        return levels.get(level).folder
    except D500Error:
        return str(level)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- integrity --------------------------------------------------------------------------------

def check_integrity(ctx: Context, report: Report) -> None:
    """Member hashes, seals and chain, the runs' entry, the signature and its signer."""
    pkg = ctx.pkg
    report.problems += [f"integrity: {p}" for p in pkg.member_problems()]
    report.problems += [f"integrity: {p}" for p in pkg.chain_problems()]
    report.problems += [f"integrity: {p}" for p in pkg.submission_problems()]
    entry = pkg.manifest.get("entry")
    groups = {r.group for r in ctx.runs if r.submission == entry and r.level == 3 and r.group}
    for run in ctx.runs:
        if run.submission != entry and not (run.group in groups and is_rank_row(run)):
            report.problems.append(f"integrity: run {run.origin_id} is a run of "
                                   f"'{run.submission}', not of the entry '{entry}' (nor a rank "
                                   f"of one of its level-3 runs)")
    try:
        chain = f"along a chain of {len(pkg.chain())} rows"
    except D500Error:
        chain = "(chain.json unreadable)"
    report.checked.append(f"integrity: {len(pkg.manifest.get('members') or {})} member hashes, "
                          f"{len(ctx.runs)} seals {chain}")
    check_signature(ctx, report)


def check_signature(ctx: Context, report: Report) -> None:
    sig = ctx.pkg.signature()
    if sig is None:
        if ctx.trusted:
            report.problems.append("integrity: the package is not signed, but --trust names "
                                   "the keys to accept")
        else:
            report.not_checked.append("signature: the package is not signed")
        return
    key = sig.public_key.lower()
    if not sig.valid:
        report.problems.append(f"integrity: signature.json (key {key[:16]}…): "
                               f"{sig.problem or 'does not verify'}")
    elif ctx.trusted and key not in ctx.trusted:
        report.problems.append(f"integrity: signed by {key[:16]}…, which is not one of the "
                               f"{len(ctx.trusted)} trusted key(s)")
    elif ctx.trusted:
        report.checked.append(f"signature: valid, by trusted key {key[:16]}…")
    else:
        report.checked.append(f"signature: valid, by {key[:16]}… (no --trust: signer not "
                              f"checked)")


# -- rules ------------------------------------------------------------------------------------

def check_rules(ctx: Context, report: Report) -> None:
    """Packaged workload files against the rulebook; runs' recorded texts against them."""
    files = ctx.pkg.workload_files()
    for rel, data in sorted(files.items()):
        ours = ctx.rulebook_text(rel)
        if ours is None:
            report.problems.append(f"rules: workload file {rel} is not in the rulebook "
                                   f"{ctx.rules_dir}")
        elif _sha(ours) != _sha(data):
            report.problems.append(f"rules: workload file {rel} differs from the rulebook's "
                                   f"(sha256 {_sha(data)[:12]}… in the package, "
                                   f"{_sha(ours)[:12]}… in {ctx.rules_dir})")
    differ: dict[str, list[int]] = {}
    for run in ctx.runs:
        problem = run_workload_problem(run, files)
        if problem is not None:
            report.problems.append(f"rules: {problem}")
        text = run.row.get("workload_text")
        if text is None:
            continue
        rel = run_workload(run, files)
        if files.get(rel) != text.encode("utf-8"):
            differ.setdefault(rel, []).append(run.origin_id)
    for rel, runs in sorted(differ.items()):
        if rel in files:
            report.problems.append(f"rules: the workload text recorded by run(s) {ids(runs)} "
                                   f"differs from the packaged {rel}")
        else:
            report.problems.append(f"rules: run(s) {ids(runs)} ran under {rel}, which the "
                                   f"package does not hold")
    report.checked.append(f"rules: {len(files)} workload file(s) against {ctx.rules_dir}")


# -- completeness -----------------------------------------------------------------------------

def check_completeness(ctx: Context, report: Report) -> None:
    """The required seeds and exact studies of each training result, no run hidden from the
    chain; the seed runs the rules did not choose listed as explorations (not scored)."""
    from d500.competition import plans
    from d500.training.seeds import required
    results: dict[tuple[int, str, str], list[Any]] = {}
    for run in ctx.runs:
        if run.level in TRAINING_LEVELS and not is_rank_row(run):
            results.setdefault((run.level, run.workload, run.backend), []).append(run)
    studies, unlisted = group_studies(ctx.runs, ctx.studies)
    report.problems += [f"completeness: {p}" for p in unlisted]
    entry: Any = None
    for (level, workload, backend), runs in sorted(results.items()):
        found = studies.pop((level, workload, backend), {})  # this result's, read or not
        rel = run_workload(runs[0], ctx.pkg.workload_files())
        text = ctx.rules_text(rel)
        try:
            need = requirement(text, rel, ctx.rules_dir) if text is not None else None
        except D500Error as err:
            report.problems.append(f"completeness: {err}")
            continue
        if need is None:
            report.problems.append(f"completeness: {result_name(level, workload, backend)}: "
                                   f"no workload file {rel} to read its requirements from")
            continue
        by_world: dict[int, list[Any]] = {}
        for run in runs:
            if is_outside_study(run):
                by_world.setdefault(world(run), []).append(run)
        for ranks, seed_runs in sorted(by_world.items()) or [(1, [])]:
            name = result_name(level, workload, backend, ranks)
            seeds = required(level, workload, runs[0].submission, backend, need.seeds, ranks)
            report.problems += [f"completeness: {name}: {p}"
                                for p in seed_problems(seed_runs, seeds, train_command(
                                    level, ranks))]
            other = explorations(seed_runs, seeds)
            ctx.explorations |= {r.origin_id for r in other}
            if other:
                report.not_scored.append(
                    f"{name}: run(s) {ids(r.origin_id for r in other)} (seed(s) "
                    f"{ids(r.seed for r in other)}) are explorations: seeds the rules did not "
                    f"choose")
        name = result_name(level, workload, backend)
        report.problems += [f"completeness: {name}: {p}"
                            for p in study_problems(found, need, backend)]
        if found and entry is None:
            try:
                entry = plans.packaged_entry(ctx.pkg)
            except D500Error as err:
                entry = err
        if isinstance(entry, D500Error) and found:
            report.problems.append(f"completeness: {name}: the tuning plan cannot be "
                                   f"recomputed: {entry}")
        elif found:
            report.problems += [f"completeness: {name}: {p}"
                                for p in plans.plan_problems(found, need, entry)]
    for (level, workload, backend), found in sorted(studies.items()):
        report.problems.append(f"completeness: {result_name(level, workload, backend)}: "
                               f"{len(found)} study(ies) without a packed trial run")
    check_chain_gaps(ctx, report, results)
    report.checked.append(f"completeness: {len(results)} training result(s) (workload x "
                          f"backend) against their workloads' required seeds and tuning plan")


def check_chain_gaps(ctx: Context, report: Report, results: dict[Any, list[Any]]) -> None:
    """Run ids the packaged chain skips (a package with training results)."""
    try:
        chain = ctx.pkg.chain()
    except D500Error:
        return  # unreadable: an integrity problem already
    gaps = chain_gaps(c[1] for c in chain) if results else []
    if gaps:
        report.problems.append(f"completeness: the chain skips run id(s) {ids(gaps)}: rows "
                               f"deleted from the ledger (a hidden run), or runs not yet ended "
                               f"when it was packaged")


# -- logs -------------------------------------------------------------------------------------

def check_logs(ctx: Context, report: Report) -> None:
    """Each MLLOG accepted by MLPerf's compliance checker (whether it is the file its run sealed
    is Package.chain_problems', under integrity)."""
    from d500.competition import compliance
    if not compliance.available():
        report.not_checked.append("logs: MLPerf's compliance checker (mlperf_logging is not "
                                  "installed: pip install mlperf-logging)")
        return
    checked = 0
    with tempfile.TemporaryDirectory(prefix="d500-check-") as tmp:
        for run in ctx.runs:
            if run.mllog_text is None:
                continue  # a missing log is an integrity problem (chain_problems)
            path = Path(tmp) / f"{run.origin_id}.mllog.txt"
            path.write_bytes(ctx.pkg.member(run.mllog_member))
            report.problems += [f"logs: run {run.origin_id} ({run.mllog_member}): {p}"
                                for p in compliance.problems(path, run.level or 0, run.status,
                                                             _is_text(ctx, run))]
            checked += 1
    report.checked.append(f"logs: {checked} MLLOG(s) by MLPerf Training {compliance.RULESET}'s "
                          f"compliance checker")


def check_restarts(ctx: Context, report: Report) -> None:
    """Resumed runs listed with their segments; a checkpoint resumed twice, a hidden segment
    or a segment's time left off flagged (d500.competition.restarts)."""
    from d500.competition import restarts
    found, listed = restarts.problems(ctx.runs)
    report.problems += [f"restarts: {p}" for p in found]
    report.checked += [f"restarts: {line}" for line in listed]


def check_consistency(ctx: Context, report: Report) -> None:
    """Each run's record against its own MLLOG (d500.competition.consistency)."""
    from d500.competition import consistency
    consistency.check(ctx, report)


# -- convergence ------------------------------------------------------------------------------

def check_convergence(ctx: Context, report: Report) -> None:
    """Each result's succeeded required seed runs (explorations apart) against its workload's
    reference; every succeeded training run's test accuracy against its validation accuracy."""
    from d500.competition import convergence
    from d500.training.precision import precision_of
    results: dict[tuple[int, str, str, int, str], list[Any]] = {}
    trained = [r for r in ctx.runs if r.level in TRAINING_LEVELS and not is_rank_row(r)]
    for run in trained:  # a result per precision: each against a reference of its own
        if is_seed_run(run) and run.origin_id not in ctx.explorations:
            results.setdefault((run.level, run.workload, run.backend, world(run),
                                precision_of(run)), []).append(run)
    rules: dict[tuple[int, str], Any] = {}
    packed = ctx.pkg.workload_files()
    files = {(r.level, r.workload): run_workload(r, packed) for r in trained}
    for (level, workload), rel in sorted(files.items()):
        try:
            rules[level, workload] = convergence.read(ctx.rules_text(rel) or b"", rel)
        except D500Error as err:
            report.problems.append(f"convergence: {err}")
    tested, unchecked = 0, set()
    for (level, workload, backend, ranks, low), runs in sorted(results.items()):
        if (level, workload) not in rules:
            continue
        ref = rules[level, workload].reference_in(low)
        if ref is None:
            unchecked.add(f"{workload} (level {level})" + ("" if low == "fp32" else f" in {low}"))
            continue
        done = [r for r in runs if r.status == "succeeded"]
        batches = {r.hyperparameters.get("batch_size") for r in done}
        verdict = convergence.check_epochs(
            ref, [r.figures.get(ref.metric) for r in done],
            batch_size=batches.pop() if len(batches) == 1 else None, precision=low)
        tested += verdict.status != convergence.NOT_CHECKED
        if verdict.flagged:
            report.problems.append(f"convergence: {result_name(level, workload, backend, ranks)}"
                                   f": {verdict.reason}")
    gaps = 0
    for run in trained:
        if run.status != "succeeded" or (run.level, run.workload) not in rules:
            continue
        rule = rules[run.level, run.workload]
        verdict = convergence.check_gap(run.figures, rule.validation, rule.test)
        gaps += verdict.status != convergence.NOT_CHECKED
        if verdict.flagged:
            report.problems.append(f"convergence: run {run.origin_id} ({run.workload} / "
                                   f"{run.backend}, seed {run.seed}): {verdict.reason}")
    report.checked.append(f"convergence: {tested} result(s) against reference convergence, "
                          f"{gaps} run(s) test vs validation accuracy")
    report.not_checked += [f"convergence: no reference for {name}" for name in sorted(unchecked)]
    check_trials(ctx, report, files)


def check_trials(ctx: Context, report: Report, files: dict[tuple[int, str], str]) -> None:
    """Each study's best trial against the reference runs at its hyperparameters, from the
    organiser's <workload>.trials.json beside the rulebook's workload file (never the
    package's): the seed-run test at the level ALPHA / trials (d500.competition.
    trial_reference)."""
    from d500.competition import convergence, trial_reference
    studies, _ = group_studies(ctx.runs, ctx.studies)  # (unlisted trials: completeness's)
    refs: dict[str, list[Any]] = {}
    tested, unchecked = 0, []
    for (level, workload, backend), found in sorted(studies.items()):
        rel = files.get((level, workload))
        if rel is None or level != 2:
            continue  # (level 3 has no tuning)
        member = trial_reference.member_of(rel)
        if member not in refs:
            text = ctx.rulebook_text(member)
            try:
                refs[member] = [] if text is None else trial_reference.read(text, member)
            except D500Error as err:
                report.problems.append(f"convergence: {err}")
                refs[member] = []
        try:
            size = requirement(ctx.rules_text(rel) or b"", rel, ctx.rules_dir).trials
        except D500Error:
            continue  # completeness says why
        for _, study in sorted(found.items()):
            name = f"{result_name(level, workload, backend)}, {study.label}"
            best = trial_reference.best_trial(study.trials, size)
            if best is None:
                continue  # no trial reached the target: nothing implausibly fast
            ref = trial_reference.find(refs[member], backend, best.hyperparameters)
            number = best.trial[1]
            if ref is None:
                unchecked.append(f"{name}'s best trial {number} (no reference trials at its "
                                 f"hyperparameters in {member})")
                continue
            verdict = convergence.check_epochs(
                ref.reference, [best.figures.get(ref.metric)],
                batch_size=best.hyperparameters.get("batch_size"),
                alpha=convergence.ALPHA / max(size, 1))
            tested += verdict.status != convergence.NOT_CHECKED
            if verdict.flagged:
                report.problems.append(
                    f"convergence: {name}: best trial {number} (run {best.origin_id}, at "
                    f"{trial_reference.point(ref.params)}): {verdict.reason} (level "
                    f"{convergence.ALPHA:g} / {size} trial(s); reference trials: {ref.command})")
    if studies:
        report.checked.append(f"convergence: {tested} study(ies)' best trial against reference "
                              f"trials at its hyperparameters")
    report.not_checked += [f"convergence: {line}" for line in unchecked]
