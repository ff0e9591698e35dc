"""Re-running K randomly chosen runs of a submission package on this machine and comparing what
must not depend on the machine (d500.competition.reproduce_compare): status, steps and epochs to
the target, accuracies and the evaluation series; on the run's own hardware also its time to
accuracy and evaluation times (d500.competition.reproduce_time).

    from d500.competition.reproduce import reproduce
    result = reproduce(pkg, runs=2, seed=None, ledger=None, rules_dir=None, data_dir=None,
                       note=print)
    result.agrees; result.seed (the draw's, to repeat it); result.runs -> [RunReport]

The draw: among the package's runs that can be re-run (an interrupted or timed-out run stopped
for reasons of its machine; a level-3 rank row other than 0 is part of its rank-0 run), K runs
are sampled by random.Random(seed); without a seed one is drawn from the system's randomness (an
entrant cannot predict which runs are re-run) and reported, so the same choice can be made
again.

Each chosen level-2/3 run is re-run with its recorded seed, backend and world size, and the
recipe rebuilt from the packaged submission files and its recorded hyperparameters, under the
packaged workload file, which must be byte for byte the rulebook's (`rules_dir`, default
levels/) or nothing is run (d500.competition.reproduce_prepare). The run goes through the real
trainers in a process of its own (d500.competition.reproduce_job; a level-3 run under
`mpiexec -n N`), with the thread count the origin's frameworks had, since another count
reassociates float sums. A level-0 run is validated again (d500.competition.reproduce_level0);
a level-1 run (net check, net bench, conformance) runs its model or node tests again on its
backend, never timed (d500.competition.reproduce_level1).
Each reproduction is an ordinary sealed run of the given ledger (no parent: nothing local), its
details naming the package's sha256 and the origin run (`details.reproduction`). The packaged
submission files are written under <ledger folder>/reproduce/<sha12>/submission/, where the
ledger's file hashes can verify them later.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.competition.reproduce_compare import COMMUNICATION, Check, Series, compare
from d500.competition.reproduce_prepare import (
    Prepared,
    Unreproducible,
    environment_changes,
    preflight,
    prepare,
    write_submission,
)
from d500.competition.reproduce_time import (
    JUDGED_UP_TO,
    hardware_note,
    judged,
    latency_checks,
    odds,
    pooled,
    slowdown,
    time_checks,
    unjudged,
)
from d500.errors import D500Error, UsageError
from d500.ledger.lifecycle import study_number, trial_label

LEVELS = (0, 1, 2, 3)
NOT_DRAWN = {  # status -> why such a run is not re-run
    "interrupted": "interrupted (stopped by a person or a dead process)",
    "timeout": "timed out (a limit of its machine)",
    "running": "never finished",
}

# Level-3 schemes whose result depends on message timing, so that even a re-run on the origin's
# machine differs (measured: async_ps at 2 ranks, digits-mlp seed 0, re-run here: the same
# epochs, test accuracy 4 samples of 300 apart, evaluations apart from the first one on).
# TODO(level-3 owner): a `timing_dependent` attribute on the Scheme classes would say it once.
TIMING_DEPENDENT = {"async_ps": "applies each worker's gradient when it arrives",
                    "ssp": "applies each worker's gradient when it arrives, within its "
                           "staleness bound"}


@dataclass
class RunReport:
    """One re-run run: what it was, its local reproduction, the checks and their verdicts."""

    origin_id: int
    level: int | None
    workload: str | None
    backend: str | None
    seed: int | None
    world_size: int | None = None
    trial: str | None = None  # "study S trial T" of the origin
    run_id: int | None = None  # the reproduction's run in the local ledger
    checks: list[Check] = field(default_factory=list)
    problem: str = ""  # why it could not be re-run or compared
    environment: list[str] = field(default_factory=list)  # how this machine differs
    threads: str = ""
    timing: str = ""  # why the run depends on timing (an asynchronous scheme), or ""
    times: str = ""  # whether its times were compared (the same hardware) or why not
    timed: tuple[float, float, float] | None = None  # (recorded, reproduced, slowdown) there

    @property
    def agrees(self) -> bool:
        return not self.problem and bool(self.checks) and all(c.agrees for c in self.checks)

    @property
    def verdict(self) -> str:
        """agrees | disagrees | inconclusive (only a time budget's cut differs) | not run."""
        if self.problem:
            return "not run"
        if self.agrees:
            return "agrees"
        judged = [c for c in self.checks if not c.agrees and not c.inconclusive]
        return "disagrees" if judged else "inconclusive"

    def disagreements(self) -> list[str]:
        """One line per disagreeing figure (or the problem), naming the origin run."""
        if self.problem:
            return [f"run {self.origin_id}: {self.problem}"]
        return [f"run {self.origin_id}: {c.line()}" for c in self.checks if not c.agrees]


@dataclass
class Reproduction:
    """What `reproduce` did: the draw (seed, from how many runs, which were left out and why)
    and every chosen run's report."""

    package: Path
    sha256: str
    entry: str
    seed: int
    seed_given: bool
    ledger: Path
    drawn_from: list[int] = field(default_factory=list)
    left_out: dict[str, list[int]] = field(default_factory=dict)  # reason -> origin ids
    runs: list[RunReport] = field(default_factory=list)
    split_seed: int | None = None
    split: list[Check] = field(default_factory=list)  # per workload, under split_seed
    fresh_seeds: int | None = None  # --fresh-seeds N: the entry re-run at N drawn seeds
    fresh: list[Check] = field(default_factory=list)  # per result, recorded against fresh
    pooled: list[Check] = field(default_factory=list)  # the draw's times on their hardware
    restarts: list[str] = field(default_factory=list)  # resumed runs and their segments

    @property
    def agrees(self) -> bool:
        return bool(self.runs) and all(r.agrees for r in self.runs) and all(
            c.agrees for c in self.split + self.pooled + self.fresh)

    def odds(self) -> dict[str, Any]:
        """How likely this draw was to hold a forged run (d500.competition.reproduce_time)."""
        return odds(len(self.drawn_from), len(self.runs))


# -- the draw ---------------------------------------------------------------------------------

def drawable(runs: list[Any]) -> tuple[list[Any], dict[str, list[int]]]:
    """The runs this command can re-run, and the others by the reason they are left out."""
    found, left = [], {}
    for run in runs:
        why = None
        if run.level not in LEVELS:
            why = f"level {run.level}: not reproducible by this command"
        elif run.status in NOT_DRAWN:
            why = NOT_DRAWN[run.status]
        elif run.level == 3 and run.rank not in (None, 0):
            why = "rank rows of a level-3 run (re-run with its rank 0)"
        if why is None:
            found.append(run)
        else:
            left.setdefault(why, []).append(run.origin_id)
    return found, left


def choose(runs: list[Any], k: int, seed: int) -> list[Any]:
    """K of the runs, sampled by random.Random(seed) from them in origin-id order; returned in
    origin-id order. The same runs and seed give the same choice on every machine."""
    ordered = sorted(runs, key=lambda r: r.origin_id)
    if k < 1:
        raise UsageError(f"--runs must be at least 1, got {k}")
    if k > len(ordered):
        raise UsageError(f"--runs {k}: the package has {len(ordered)} run(s) this command can "
                         f"re-run; give --runs {len(ordered)}"  # a first try: no --runs given
                         + (" (2 is the default)" if k == 2 else " or fewer"))
    picked = random.Random(seed).sample(range(len(ordered)), k)
    return [ordered[i] for i in sorted(picked)]


def new_seed() -> int:
    """A draw seed nobody can predict (the system's randomness), reported to repeat it."""
    return random.SystemRandom().randrange(2**31)


# -- running ----------------------------------------------------------------------------------

def execute(prepared: Prepared, ledger: Path, details: dict[str, Any], data_dir: str | None,
            jobs: Path) -> dict[str, Any]:
    """Re-run one prepared run in its own process (under mpiexec at level 3); its result
    ({run_id, status, figures, error, threads}). A D500Error (exit 2) when this machine cannot
    run it at all (no dataset, no backend, no mpiexec); a failed process is `failed`."""
    run = prepared.run
    job = jobs / f"run-{run.origin_id}.json"
    out = jobs / f"run-{run.origin_id}.result.json"
    out.unlink(missing_ok=True)
    level3 = run.level == 3 and run.world_size is not None
    level = 3 if level3 else run.level if run.level in (0, 1) else 2
    job.write_text(json.dumps({
        "level": level, "ledger": str(ledger), "backend": run.backend, "case": run.workload,
        "workload": None if prepared.workload_file is None else str(prepared.workload_file),
        "submission": str(prepared.submission_dir),
        "seed": run.seed, "params": prepared.params, "details": details, "data": data_dir,
        "threads": prepared.threads, "out": str(out),
        "split_seed": details["reproduction"].get("split_seed"),
        "group": f"reproduction of run {run.origin_id} ({details['reproduction']['package']})",
    }, indent=1, default=str))
    argv = [sys.executable, "-m", "d500.competition.reproduce_job", str(job)]
    env = dict(os.environ)
    if level3:
        from d500.distributed.launcher import mpiexec
        launcher = mpiexec()  # present: preflight checked it
        argv = [str(launcher), "-disable-auto-cleanup", "-n", str(run.world_size), *argv]
        if prepared.threads is not None:
            env["OMP_NUM_THREADS"] = str(prepared.threads)
    timeout = prepared.timeout
    before = _last_id(ledger)
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"run_id": None, "status": "failed",
                "error": f"the reproduction did not finish within {timeout:g} s"}
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    if out.is_file():
        return sealed(json.loads(out.read_text()), ledger, details, before, level)
    last = proc.stderr.strip().splitlines()[-1:]
    why = errors[0].split("error:", 1)[1].strip() if errors else (
        f"exited {proc.returncode}" + (f": {last[0]}" if last else ""))
    if proc.returncode == 2:
        raise D500Error(f"run {run.origin_id}: {why}")
    return {"run_id": None, "status": "failed", "error": why}


def _last_id(path: Path) -> int:
    """The newest run id of the ledger at `path` (0: none yet)."""
    import sqlite3
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        db.close()


def sealed(result: Any, path: Path, details: dict[str, Any], before: int, level: int
           ) -> dict[str, Any]:
    """A job's result with its status, figures and error read from the run it names in the
    ledger, which d500's own process sealed: at levels 2 and 3 the result file is written by a
    process the entry's code ran in (level 3: rank 0; an atexit hook rewrote it), so it only
    names the run, which must be new and carry this reproduction's stamp; else `failed`."""
    from d500.ledger import Ledger
    if level not in (2, 3) or not isinstance(result, dict) or result.get("run_id") is None:
        return result
    rid, row = result["run_id"], None
    if isinstance(rid, int) and not isinstance(rid, bool) and rid > before:
        try:
            row = Ledger(path).get(rid)
        except UsageError:
            row = None
    if row is None or (row.get("details") or {}).get("reproduction") != details["reproduction"]:
        return {"run_id": None, "status": "failed",
                "error": f"the reproduction named run {rid!r}, not a run it made in {path}"}
    return {**result, "status": row["status"], "figures": row["figures"],
            "error": row["error"] or ""}


def report_of(prepared: Prepared, result: dict[str, Any], ledger: Any,
              split_seed: int | None = None) -> RunReport:
    """The checks of one re-run run against its origin (under `split_seed`: its epochs to target
    only, d500.competition.reproduce_split)."""
    run, wl = prepared.run, prepared.workload
    rep = RunReport(run.origin_id, run.level, run.workload, run.backend, run.seed,
                    run.world_size, prepared.trial or None, result.get("run_id"))
    rep.threads = (f"{prepared.threads} ({prepared.threads_from})" if prepared.threads
                   else prepared.threads_from)
    rep.environment = environment_changes(run.environment, run.backend)
    scheme = run.hyperparameters.get("scheme") if run.level == 3 else None
    if scheme in TIMING_DEPENDENT:
        rep.timing = (f"scheme {scheme} {TIMING_DEPENDENT[scheme]}: its result depends on "
                      "message timing, so even a re-run on the origin's machine differs")
    if rep.run_id is None:
        rep.problem = f"the reproduction did not run: {result.get('error')}"
        return rep
    if run.level in (0, 1):
        from d500.competition import reproduce_level0, reproduce_level1
        rep.checks = (reproduce_level0 if run.level == 0 else reproduce_level1).checks(run, result)
        if (run.level == 0 and run.hyperparameters.get("mode") == "bench") or (
                run.level == 1 and reproduce_level1.kind(run) == "bench"):
            local = ledger.get(rep.run_id)
            same, rep.times = hardware_note(run.environment, local.get("provenance"))
            if same:
                load = _load(prepared, local, rep)
                rep.checks += latency_checks(run.figures, result.get("figures") or {}, load)
        return rep
    if split_seed is not None:  # epochs only, judged pooled (reproduce_split.pooled)
        from d500.competition import reproduce_split
        rep.checks = [reproduce_split.check(run.figures, result.get("figures") or {},
                                            (run.status, result["status"]),
                                            _reference(prepared).metric
                                            if _reference(prepared) else "epochs", split_seed)]
        return rep
    sizes = {"validation": wl.dataset["validation"], "test": wl.dataset["test"]}
    series = (Series.of(run.evaluations), Series.of(ledger.evaluations(rep.run_id)))
    rep.checks = compare(run.figures, result.get("figures") or {},
                         (run.status, result["status"]), series, sizes, wl.target,
                         (run.error, result.get("error") or None),
                         COMMUNICATION if run.level == 3 else ())
    local = ledger.get(rep.run_id)
    same, rep.times = hardware_note(run.environment, local.get("provenance"))
    if same:
        load = _load(prepared, local, rep)
        rep.checks += time_checks(run.figures, result.get("figures") or {},
                                  (run.evaluations, local["evaluations"]), load)
        a, b = (f.get("time_to_accuracy") for f in (run.figures, result.get("figures") or {}))
        if judged(load) and all(isinstance(v, (int, float)) and math.isfinite(v)
                                for v in (a, b)):
            rep.timed = (a, b, load)  # pooled with the draw's other judged runs
    return rep


def _load(prepared: Prepared, local: dict[str, Any], rep: RunReport) -> float:
    """The reproduction's `slowdown` at the cores it wants (its ranks x threads; at level 0 at
    least 2: the judge times the operator's host process across round trips, two processes
    that meet at every call), noted in `rep.times` where it widened the tolerance or was too
    loaded to judge times at all."""
    details = local.get("details") or {}
    ranks = prepared.run.world_size if prepared.run.level == 3 else None
    demand = None if prepared.threads is None else prepared.threads * (ranks or 1)
    if prepared.run.level == 0 and demand is not None:
        demand = max(2, demand)
    # a level-1 bench's passes each measured apart: the worst of them (a neighbour's burst
    # beside one pass, averaged over all, read as quiet: an honest latency 2.16x was accused)
    records = [details.get("load_average"), *(details.get("load_by_pass") or {}).values()]
    load, record = max(((slowdown(r, demand), r) for r in records if r),
                       key=lambda pair: pair[0], default=(math.inf, None))
    if record is None:  # never read as quiet: a level-1 bench's was missing, so judged at 1x
        rep.times += ("; times not judged: the reproduction recorded no load (how busy this "
                      "machine was while it was timed)")
    elif not judged(load):
        rep.times += f"; {unjudged(record, demand)}"
    elif load > 1.0:
        rep.times += (f"; this machine was loaded while reproducing: the tolerance is widened "
                      f"{load:.2f}x (at most {JUDGED_UP_TO:g}x: a halved time still shows)")
    return load


def reproduce(pkg: Any, runs: int = 2, seed: int | None = None, ledger: str | Path | None = None,
              rules_dir: str | Path | None = None, data_dir: str | None = None,
              note: Any = lambda text: None, split_seed: int | None = None,
              fresh_seeds: int | None = None) -> Reproduction:
    """Draw `runs` runs of the package by `seed` (None: an unpredictable one, reported),
    refuse the draw unless every chosen run's workload file is the rulebook's, re-run each and
    compare it; `note` gets a line as each run starts and ends. `split_seed`: re-run levels 2
    and 3 under that split of the dataset instead of the workload's, and compare epochs to
    target only (d500.competition.reproduce_split). `fresh_seeds` N: instead of drawn runs,
    re-run each result's entry at N seeds drawn from the draw seed and test its recorded
    required-seed runs against them (d500.competition.reproduce_seeds)."""
    from d500.ledger import Ledger
    from d500.paths import rulebook

    rules = Path(rules_dir) if rules_dir is not None else rulebook()
    if not rules.is_dir():
        from d500.paths import no_folder
        raise UsageError(f"--rules {rules}: {no_folder(rules)}")
    drawn = new_seed() if seed is None else seed
    candidates, left_out = drawable(pkg.runs())
    chosen = [] if fresh_seeds is not None else choose(candidates, runs, drawn)
    book = Ledger(ledger)  # after the draw: a mistake in --runs creates no ledger
    result = Reproduction(pkg.path, pkg.sha256, pkg.manifest["entry"], drawn, seed is not None,
                          book.path)
    result.left_out = left_out
    from d500.competition import restarts  # every resumed run's segments, listed
    result.restarts = restarts.problems(pkg.runs())[1]
    result.drawn_from = [r.origin_id for r in candidates]
    folder = book.root / "reproduce" / pkg.sha256[:12]
    submission_dir = write_submission(pkg, folder / "submission")
    jobs = folder / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    if fresh_seeds is not None:
        return fresh(pkg, result, fresh_seeds, (rules, submission_dir, jobs), book, data_dir,
                     note)
    ready: list[Prepared | RunReport] = []
    result.split_seed = split_seed
    pairs: dict[str, tuple[Any, list[tuple[float, float]]]] = {}
    numbers = study_numbers(pkg)
    for run in chosen:  # every refusal before anything runs
        try:
            ready.append(prepare(pkg, run, rules, submission_dir))
            if run.trial is not None:
                ready[-1].trial = trial_label(numbers.get(run.study), run.number, run.study)
            preflight(ready[-1], data_dir)
        except Unreproducible as err:
            ready.append(RunReport(run.origin_id, run.level, run.workload, run.backend,
                                   run.seed, run.world_size, problem=f"not reproducible: {err}"))
    for i, item in enumerate(ready, 1):
        if isinstance(item, RunReport):
            result.runs.append(item)
            continue
        run = item.run
        note(f"[{i}/{len(ready)}] run {run.origin_id}: {run.workload} / {run.backend}"
             + ("" if run.seed is None else f" / seed {run.seed}")
             + (f" x{run.world_size} ranks" if run.world_size else "")
             + (f", {item.trial}" if item.trial else "")
             + f": re-running (recorded: {run.status})")
        details = {"reproduction": {
            "package": pkg.sha256, "entry": result.entry, "origin_run": run.origin_id,
            "origin_row_hash": run.row_hash, "draw_seed": result.seed}}
        if split_seed is not None and run.level in (2, 3):
            details["reproduction"]["split_seed"] = split_seed
        found = execute(item, book.path, details, data_dir, jobs)
        report = report_of(item, found, book,
                           split_seed if run.level in (2, 3) else None)
        result.runs.append(report)
        if split_seed is not None and run.level in (2, 3):
            pairs.setdefault(run.workload, (_reference(item), []))[1].extend(
                (c.recorded, c.reproduced) for c in report.checks if not c.inconclusive)
        note(f"[{i}/{len(ready)}] run {run.origin_id}: reproduced as run {report.run_id}: "
             + report.verdict)
    if split_seed is not None:
        from d500.competition import reproduce_split
        result.split = [reproduce_split.pooled(name, found, reference, split_seed)
                        for name, (reference, found) in pairs.items()]
    together = pooled([r.timed for r in result.runs if r.timed is not None])
    result.pooled = [together] if together is not None else []
    return result


def fresh(pkg: Any, result: Reproduction, n: int, where: tuple[Path, Path, Path], book: Any,
          data_dir: str | None, note: Any) -> Reproduction:
    """`reproduce(fresh_seeds=n)`: each level-2/3 result's entry re-run at n seeds drawn from
    the draw seed, each a reproduction of the result's first required-seed run at another seed,
    and the recorded required-seed runs tested against them (reproduce_seeds.verdict). This
    ledger's boards score the result on these runs (d500.training.seeds.drawn); n below a
    workload's `seeds:` is refused before anything runs."""
    import dataclasses

    from d500.competition import reproduce_seeds
    rules, submission_dir, jobs = where
    result.fresh_seeds = n
    found = reproduce_seeds.results(pkg.runs())
    if not found:
        raise UsageError(f"{pkg.path}: --fresh-seeds: the package holds no level-2 or level-3 "
                         "run of a required seed to compare fresh seeds with")
    ready = []
    for template, required in found:  # every refusal before anything runs
        try:
            prepared = prepare(pkg, template, rules, submission_dir)
            preflight(prepared, data_dir)
            ready.append((prepared, required))
        except Unreproducible as err:
            result.runs.append(RunReport(template.origin_id, template.level, template.workload,
                                         template.backend, None, template.world_size,
                                         problem=f"not reproducible: {err}"))
    for prepared, _ in ready:  # the board scores drawn seeds only at the workload's N or more
        need = getattr(prepared.workload, "seeds", None) or 1
        if n < need:
            raise UsageError(f"--fresh-seeds {n}: {prepared.run.workload} scores {need} seeds "
                             f"(its `seeds:`), and the board scores a result at the organiser's "
                             f"seeds only at {need} or more: draw at least {need}")
    for prepared, required in ready:
        template = prepared.run
        cap = getattr(prepared.workload, "max_epochs", None) or 10**6
        recorded = [v for v in (reproduce_seeds.value(r.status, r.figures, cap)
                                for r in required) if v is not None]
        values = []
        seeds = reproduce_seeds.draw(result.seed, template.workload, template.backend, n)
        for i, s in enumerate(seeds, 1):
            note(f"[{i}/{n}] {template.workload} / {template.backend}: fresh seed {s}")
            item = dataclasses.replace(prepared, run=dataclasses.replace(
                template, row={**template.row, "seed": s}))
            details = {"reproduction": {
                "package": pkg.sha256, "entry": result.entry, "origin_run": template.origin_id,
                "origin_row_hash": template.row_hash, "draw_seed": result.seed,
                "fresh_seed": s}}
            run = execute(item, book.path, details, data_dir, jobs)
            rep = RunReport(template.origin_id, template.level, template.workload,
                            template.backend, s, template.world_size, None, run.get("run_id"))
            v = reproduce_seeds.value(run.get("status"), run.get("figures") or {}, cap)
            if rep.run_id is None:
                rep.problem = f"the fresh-seed run did not run: {run.get('error')}"
            else:
                rep.checks = [Check("status", None, run.get("status"), "reported", True),
                              Check("epochs", None, (run.get("figures") or {}).get("epochs"),
                                    "reported; judged together with the other fresh seeds",
                                    True, note="not counted: it ended without its epochs "
                                               "saying anything of its seed" if v is None
                                    else "")]
                if v is not None:
                    values.append(v)
            result.runs.append(rep)
            note(f"[{i}/{n}] fresh seed {s}: run {rep.run_id}, {run.get('status')}")
        result.fresh.append(reproduce_seeds.verdict(template.workload, result.entry,
                                                    template.backend, recorded, values,
                                                    result.seed))
    return result


def study_numbers(pkg: Any) -> dict[int, int | None]:
    """{origin study id: its number in the entry's tuning} of the package's studies, so that
    a trial is named as `d500 tune` and `d500 ledger list` name it."""
    try:
        return {s.get("id"): study_number(s.get("name")) for s in pkg.studies()
                if isinstance(s, dict)}
    except D500Error:  # an unreadable studies.json: d500 check names it
        return {}


def _reference(prepared: Prepared) -> Any:
    """The reference convergence of a prepared training run's workload in the run's precision
    (None: it has none)."""
    from d500.competition import convergence
    from d500.training.precision import precision_of
    path = prepared.workload_file
    return convergence.read(path.read_bytes(), path).reference_in(precision_of(prepared.run))
