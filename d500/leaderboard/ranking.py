"""Ledger rows -> ranked boards of numbers: grouping, aggregation (d500.metrics), ranks, ratios.

One board per (level, workload, workload file sha256, model sha256): runs under different rules or
models are never aggregated together. Within a board an entry is one submission x backend on one
machine (hardware identity, d500.leaderboard.environments) from one source (this ledger or one
imported package): runs of different hardware are never aggregated together. A ranking metric
that depends on the hardware ranks entries only against entries of the same machine, unless
`across_machines`. Nothing here formats text; the renderers do.

At the training levels, a result the organiser re-ran at seeds it drew after the package was
committed (`d500 reproduce --fresh-seeds N`, `d500.training.seeds.drawn`) is scored on those runs:
their row is ranked, the package's own row (its required seeds, which the sender could know
before running, and pick by picking a name) is listed beside it, unranked. On a board with such a
row, every row scored on seeds known before its runs is listed after, unranked (`seeds_note`).

An entry whose imported package holds the code of a package imported earlier under another entry
name (d500.competition.same_code) is that entry: the first imported ranks, the later names' rows
are listed after the ranked rows, unranked, each naming it (`seeds_note`), so that one entry's
code sent under K names (K draws of the organiser's seeds) never ranks as the best of K.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from d500 import metrics as _metrics
from d500 import progress
from d500 import workload as _workload
from d500.errors import ConfigError, D500Error
from d500.leaderboard.environments import machine, machine_dependent
from d500.metrics import Metric
from d500.training.precision import precision_of

NOT_COUNTED = ("interrupted", "running")  # no outcome yet (or never): listed, never aggregated


@dataclass
class Entry:
    """One (submission, backend) of a workload on one machine, from this ledger or from one
    imported package: its runs and their aggregates. `rank` and `ratio` are within the entry's
    ranking group (its machine when the board ranks per machine, else the whole board)."""

    submission: str
    backend: str
    machine: str = ""  # hardware key of its runs' environment ("" when none was recorded)
    package: dict[str, Any] | None = None  # {"id", "entry", "sha256", "forced"} when imported
    threads: int | None = None  # the thread count its runs ran at (runs at another: another row)
    loaded: bool = False  # its runs were timed on a loaded machine: ranked apart, never a winner
    variant: str = ""  # what tells it from a row of the same name ("1 thread"), else ""
    precision: str = "fp32"  # what its runs computed in: a bf16 run never shares an fp32 row
    runs: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    aggregate: dict[str, float | None] = field(default_factory=dict)
    spread: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    rank: int | None = None
    ratio: float | None = None
    missed: int = 0  # succeeded runs without the ranking metric's figure (target missed)
    problems: list[str] = field(default_factory=list)
    seeds_note: str = ""  # why its seeds do not rank it (the organiser's seeds score), or ""
    beside: bool = False  # with a seeds_note: listed beside the row that scores it, else after
    environments: list[dict[str, Any]] = field(default_factory=list)  # distinct, run order
    environment_ids: list[int] = field(default_factory=list)  # their ledger ids, same order

    @property
    def label(self) -> str:
        """The backend as the row names it, with its variant when another row shares it."""
        return f"{self.backend} · {self.variant}" if self.variant else self.backend

    @property
    def counts(self) -> Counter:
        return Counter(r["status"] for r in self.runs)

    @property
    def verified(self) -> bool:
        return not self.problems

    @property
    def tuning_seconds(self) -> float:
        """Wall time of every tuning trial of this entry (failed and diverged ones too)."""
        return sum(r["duration"] or 0.0 for r in self.trials)


@dataclass
class Board:
    """One workload (one version of its rules): the ranked entries and the runs not counted."""

    level: int | None
    workload: str
    workload_sha256: str | None
    metrics: list[Metric]
    rank_by: Metric | None
    how: str
    entries: list[Entry]
    version_note: str = ""
    description: str = ""
    rules_problem: str = ""  # why the recorded workload text no longer gives rules (unranked)
    world_size: int | None = None  # distributed runs (level 3): one board per world size
    across_machines: bool = False  # the organiser asked to rank times across machines

    @property
    def machines(self) -> list[str]:
        """The hardware keys of the board's entries, in the order the entries show them."""
        return list(dict.fromkeys(e.machine for e in self.entries))

    @property
    def per_machine(self) -> bool:
        """Whether entries are ranked within their machine only: a machine-dependent figure
        measured on more than one machine, and the organiser did not ask to rank across them."""
        return (self.rank_by is not None and machine_dependent(self.rank_by)
                and len(self.machines) > 1 and not self.across_machines)

    @property
    def not_succeeded(self) -> list[dict[str, Any]]:
        return [r for e in self.entries for r in e.runs + e.trials if r["status"] != "succeeded"]

    @property
    def run_count(self) -> int:
        return sum(len(e.runs) + len(e.trials) for e in self.entries)


def build(ledger: Any = None, level: int | None = None, workload: str | None = None,
          across_machines: bool = False) -> list[Board]:
    """Group, aggregate and rank every run of the ledger (optionally one level / workload):
    boards ordered by level, workload, then newest rules version first. Times and rates
    measured on different hardware are ranked apart unless `across_machines`."""
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    progress.step("verifying the ledger")
    per_run, general = ledger.verify_runs()
    progress.step("ranking the runs")
    return _boards(ledger.runs(level=level, workload=workload), per_run, general,
                   ledger.environments(), across_machines, _copies(ledger))


def boards_for(ledger: Any, workloads: Iterable[tuple[int | None, str]],
               across_machines: bool = False) -> list[Board]:
    """The board of the newest rules version of each (level, workload name), in the order given
    (repeats dropped; a workload without runs gives no board). Verifies the ledger once."""
    progress.step("verifying the ledger")
    per_run, general = ledger.verify_runs()
    progress.step("ranking the runs")
    envs = ledger.environments()
    copies = _copies(ledger)
    boards: list[Board] = []
    for level, name in dict.fromkeys(workloads):
        found = _boards(ledger.runs(level=level, workload=name), per_run, general, envs,
                        across_machines, copies)
        boards += [b for b in found if found and b.workload_sha256 == found[0].workload_sha256]
    return boards


def _copies(ledger: Any) -> dict[str, Any]:
    """{package sha256: same_code.Copy} of the imported packages whose code is another entry's."""
    from d500.competition import same_code
    return same_code.copies(ledger) if hasattr(ledger, "packages") else {}


def _boards(runs: list[dict[str, Any]], per_run: dict[int, list[str]], general: list[str],
            envs: dict[int, Any], across_machines: bool = False,
            copies: dict[str, Any] | None = None) -> list[Board]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    # a partial run (`d500 conformance --op X`) is a quick check, not a result: no board
    runs = [r for r in runs if not (r.get("details") or {}).get("partial")]
    for r in runs:  # the same rules (workload file, model) and, run apart, the same world size
        world = r["world_size"] if r["study"] is None else None
        groups.setdefault((r["level"], r["workload"], r["workload_sha256"], r["model_sha256"],
                           world), []).append(r)
    rules = {k[:4] for k in groups}  # versions of each workload's rules
    versions = Counter((lvl, name) for lvl, name, _, _ in rules)
    newest = {v: max(r["started_unix"] for k, g in groups.items() if k[:4] == v for r in g)
              for v in rules}
    boards = []
    for (lvl, name, sha, model_sha, world), group in sorted(groups.items(), key=lambda kv: (
            kv[0][0] if kv[0][0] is not None else -1, kv[0][1] or "", -newest[kv[0][:4]],
            kv[0][4] or 0)):
        board = _board(lvl, name, sha, group, per_run, general, envs, across_machines, copies)
        board.world_size = world
        if versions[(lvl, name)] > 1:
            model = f", model {model_sha[:12]}" if model_sha else ""
            board.version_note = (f"rules version {sha[:12] if sha else 'unrecorded'}{model}: "
                                  "the workload file or the model changed between runs; "
                                  "versions are ranked apart")
        boards.append(board)
    return boards


@dataclass(frozen=True)
class _Rules:
    names: list[str]
    rank_by: str | None
    how: str | None
    description: str = ""
    problem: str = ""


def _rules(group: list[dict[str, Any]]) -> _Rules:
    """The scoring rules of the workload text stored with the group's runs (one text: the group
    shares its sha256). Without a text, or when it no longer reads as rules (e.g. a metric file
    removed since), every recorded figure is shown, unranked; the problem says why."""
    last = group[-1]
    recorded = sorted({n for r in group for n in r["figures"]})
    if not last["workload_text"]:
        return _Rules(recorded, None, None)
    where = f"{last['workload_file'] or last['workload']} (as recorded with run {last['id']})"
    try:
        rules = _workload.rules(last["workload_text"], where)
    except ConfigError as err:
        return _Rules(recorded, None, None, problem=str(err))
    if not rules.metrics:
        return _Rules(recorded, None, None)
    return _Rules(list(rules.metrics), rules.rank_by, rules.aggregate, rules.description)


def _defined(names: list[str]) -> list[Metric]:
    """The definitions of the names that have one (a figure whose metric file is gone cannot be
    aggregated or formatted: it is left out)."""
    known = []
    for name in names:
        try:
            known.append(_metrics.get(name))
        except D500Error:
            continue
    return known


def _board(level: int | None, name: str, sha: str | None, group: list[dict[str, Any]],
           per_run: dict[int, list[str]], general: list[str], envs: dict[int, Any],
           across_machines: bool = False, copies: dict[str, Any] | None = None) -> Board:
    rules = _rules(group)
    known = _defined(rules.names)
    rank_by = next((m for m in known if m.name == rules.rank_by), None)
    entries: dict[tuple, Entry] = {}
    for r in group:
        package = origin(r)  # from a competition package, or reproducing one
        env = envs.get(r["environment"])
        key = (r["submission"] or "", r["backend"] or "", machine(env),
               (package.get("drawn"), package.get("id", package.get("sha256")))
               if package else None,
               ((env or {}).get("threads") or {}).get("count"), run_loaded(r),
               precision_of(r))
        entry = entries.setdefault(key, Entry(*key[:3], package=package, threads=key[4],
                                              loaded=key[5], precision=key[6]))
        (entry.trials if r["study"] is not None else entry.runs).append(r)
        entry.problems += per_run.get(r["id"], [])
        if env and env not in entry.environments:
            entry.environments.append(env)
            entry.environment_ids.append(r["environment"])
    for entry in entries.values():
        entry.problems += general
        scored = _scored(level, entry.runs)
        for metric in known:
            vals = _values(scored, metric)
            entry.values[metric.name] = vals
            entry.aggregate[metric.name] = _metrics.aggregate(vals, rules.how or metric.aggregate)
            entry.spread[metric.name] = _metrics.spread(vals)
        if rank_by is not None and rank_by.missing is not None:
            entry.missed = sum(1 for r in scored if r["status"] == "succeeded" and (
                r["figures"].get(rank_by.name) in (None, rank_by.missing)))
    board = Board(level, name, sha, known, rank_by, rules.how or "per-metric default", [],
                  description=rules.description, rules_problem=rules.problem,
                  across_machines=across_machines)
    _name_variants(list(entries.values()))
    if level in (2, 3):
        _seeds_notes(list(entries.values()))
    _code_notes(list(entries.values()), copies or {})
    board.entries = _ranked(list(entries.values()), rank_by, across_machines)
    return board


def comparable(entries: list[Entry]) -> list[Entry]:
    """The entries a winner or a summary may compare: those timed on a quiet machine, or all of
    them where every one was timed on a loaded machine (then each one shows its mark)."""
    every_loaded = all(e.loaded for e in entries)
    return [e for e in entries if e.loaded == every_loaded]


def run_loaded(run: dict[str, Any]) -> bool:
    """Whether a run was timed on a loaded machine, by the share of the process that draws the
    board (d500.provenance.is_loaded on the figures the run recorded, not its own flag)."""
    from d500.provenance import is_loaded
    load = (run.get("details") or {}).get("load_average")
    return isinstance(load, dict) and is_loaded(load)


def _name_variants(entries: list[Entry]) -> None:
    """Rows of one submission and backend at different thread counts say their count; a row
    trained in another precision than fp32 says it always."""
    counts: dict[tuple, set] = {}
    for e in entries:
        counts.setdefault((e.submission, e.backend, e.machine), set()).add(e.threads)
    for e in entries:
        if len(counts[(e.submission, e.backend, e.machine)]) > 1:
            e.variant = ("threads: default" if e.threads is None
                         else f"{e.threads} thread{'s' * (e.threads != 1)}")
        if e.precision != "fp32":
            e.variant = ", ".join(v for v in (e.variant, e.precision) if v)


def origin(run: dict[str, Any]) -> dict[str, Any] | None:
    """Where a run comes from when it is not the ledger's own: its entry's latest imported
    package (its `source`: every package of one entry, forced apart, is one row, pooled), or (a
    `d500 reproduce` run) the package it reproduces; such runs are ranked apart from the
    entry's own runs (a reproduction re-checks a result; it is not one of the organiser's)."""
    if run.get("source"):
        return run["source"]
    if run.get("package"):
        return run["package"]
    rep = (run.get("details") or {}).get("reproduction")
    if not isinstance(rep, dict):
        return None
    from d500.training.seeds import drawn
    if drawn(run):  # scored: a run at a seed the organiser drew (d500 reproduce --fresh-seeds)
        return {"sha256": rep.get("package"), "entry": rep.get("entry"), "drawn": True}
    return {"sha256": rep.get("package"), "entry": rep.get("entry"), "reproduction": True}


def submission_label(submission: str, source: dict[str, Any] | None) -> str:
    """A submission's name as boards and views show it: for runs imported from a package, the
    entry and its latest package's digest (a note when earlier packages are pooled with it),
    and a mark when it was imported with --force despite failing `d500 check`; for `d500
    reproduce` runs, the package they reproduce."""
    if not source:
        return submission
    sha = (source.get("sha256") or "")[:8]
    if source.get("reproduction"):
        return f"{submission} · reproduction of package {sha}".rstrip()
    if source.get("drawn"):
        return f"{submission} · at the organiser's seeds, package {sha}".rstrip()
    forced = " ⚠ forced (failed d500 check)" if source.get("forced") else ""
    count = source.get("packages") or 1
    pooled = f" (pooled with {count - 1} earlier package(s))" if count > 1 else ""
    return (f"{submission} · package {source.get('entry') or '?'} {sha}".rstrip() + pooled
            + forced)


def _ranked(entries: list[Entry], rank_by: Metric | None, across_machines: bool) -> list[Entry]:
    """Entries ranked and ordered: by machine first (machines in the order of their first run)
    when a machine-dependent metric ranks entries of several machines, else all together;
    entries timed on a loaded machine after the clean ones, ranked among themselves (apart);
    entries forced in past `d500 check` after the others, without rank or ratio; `d500
    reproduce` runs never ranked either, each entry of them right after the one it reproduces."""
    copies = [e for e in entries if reproduction(e) or e.beside]
    after = [e for e in entries if not reproduction(e) and e.seeds_note
             and not e.beside]  # seeds known before its runs: after, unranked
    entries = [e for e in entries if not reproduction(e) and not e.seeds_note]
    first_run = {}
    for e in entries:
        start = min((r["started_unix"] or 0 for r in e.runs + e.trials), default=0)
        first_run[e.machine] = min(first_run.get(e.machine, start), start)
    by_machine = (rank_by is not None and machine_dependent(rank_by) and not across_machines
                  and len(first_run) > 1)
    groups: dict[tuple[str, bool], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.machine if by_machine else "", e.loaded), []).append(e)
    ordered: list[Entry] = []
    for key in sorted(groups, key=lambda k: (first_run.get(k[0], 0), k[0], k[1])):
        ranked = sorted(groups[key], key=lambda e: (
            forced(e), rank_by.sort_key(e.aggregate.get(rank_by.name)) if rank_by else 0,
            e.submission, e.backend, first_run[e.machine], e.machine))
        if rank_by is not None:
            complete = [e for e in ranked if not forced(e)]
            best = rank_by.best(e.aggregate.get(rank_by.name) for e in complete
                                if e.aggregate.get(rank_by.name) is not None
                                and math.isfinite(e.aggregate[rank_by.name]))
            for i, e in enumerate(complete, 1):
                value = e.aggregate.get(rank_by.name)
                e.rank = i if value is not None else None
                e.ratio = rank_by.ratio_to_best(value, best)
        ordered += ranked
    ordered += sorted(after, key=lambda e: (
        rank_by.sort_key(e.aggregate.get(rank_by.name)) if rank_by else 0, e.submission,
        e.backend, e.machine))
    for copy in sorted(copies, key=lambda e: (e.submission, e.backend, e.machine)):
        ordered.insert(_beside(ordered, copy), copy)
    return ordered


def drawn_entry(entry: Entry) -> bool:
    """Whether an entry's runs are the organiser's fresh-seed reproductions (they score)."""
    return bool(entry.package and entry.package.get("drawn"))


def _seeds_notes(entries: list[Entry]) -> None:
    """Which rows the seeds leave unranked, and why (`Entry.seeds_note`): a row at the
    organiser's seeds holding fewer drawn seeds than the workload scores (N, its `seeds:`) is
    listed beside its package's row; where one holds N or more, the rows of its entry (submission,
    backend, precision) scored on their own required seeds (which the entry's name picks) are
    listed beside it, and every other row scored on seeds known before its runs is listed after
    the ranked rows."""
    from d500.training.seeds import scoring
    scoring_rows = set()
    drawn_seeds: dict[tuple, set] = {}  # a result's drawn seeds, its rows split by load or not
    for e in (e for e in entries if drawn_entry(e)):
        drawn_seeds.setdefault((e.submission, e.backend, e.precision, e.package.get("sha256")),
                               set()).update(r.get("seed") for r in _scored(2, e.runs))
    for e in (e for e in entries if drawn_entry(e)):
        first = e.runs[0] if e.runs else {}
        need = scoring(first.get("workload_text"), first.get("workload_file")) or 1
        have = len(drawn_seeds[(e.submission, e.backend, e.precision, e.package.get("sha256"))])
        if have < need:
            e.seeds_note, e.beside = f"not scored: {have} of {need} drawn seeds", True
        else:
            scoring_rows.add((e.submission, e.backend, e.precision))
    if not scoring_rows:
        return
    for e in entries:
        if drawn_entry(e) or reproduction(e) or not e.runs:
            continue
        if (e.submission, e.backend, e.precision) in scoring_rows:
            e.seeds_note, e.beside = "not scored: its own seeds; the organiser's score it", True
        else:
            e.seeds_note = "unranked: its seeds were known before its runs"


def _code_notes(entries: list[Entry], copies: dict[str, Any]) -> None:
    """Rows of a package whose code an entry of another name imported first holds (its own
    rows, its fresh-seed and other reproductions): unranked, listed after, naming that entry."""
    for e in entries:
        copy = copies.get((e.package or {}).get("sha256") or "")
        if copy is not None and not reproduction(e):
            e.seeds_note = f"unranked: its code is entry {copy.entry}'s (package {copy.sha256[:8]})"
            e.beside = False


def reproduction(entry: Entry) -> bool:
    """Whether an entry's runs are `d500 reproduce` runs (a re-check of a package's result)."""
    return bool(entry.package and entry.package.get("reproduction"))


def _beside(ordered: list[Entry], copy: Entry) -> int:
    """Where a reproduction's entry goes: after the entry of the package it reproduces (the same
    submission and backend; else after the same submission's last row), else at the end."""
    sha = (copy.package or {}).get("sha256")

    def of_package(e: Entry) -> bool:
        return bool(e.package) and e.package.get("sha256") == sha

    for same in (lambda e: of_package(e) and e.backend == copy.backend, of_package,
                 lambda e: e.backend == copy.backend, lambda e: True):
        found = [i for i, e in enumerate(ordered) if e.submission == copy.submission and same(e)]
        if found:
            return found[-1] + 1
    return len(ordered)


def forced(entry: Entry) -> bool:
    """Whether an entry's runs came in a package forced past `d500 check`: listed with its
    mark after every complete entry, unranked (it never outranks one)."""
    return bool(entry.package and entry.package.get("forced"))


def _scored(level: int | None, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs a board aggregates: every one, except at the training levels (2, 3), where only
    the runs of the seeds the rules require score (d500.training.seeds; explorations are listed,
    never aggregated), a required seed only interrupted counts as a miss, and time to accuracy
    is scaled by MLPerf's RCP normalization (d500.training.score.scaled)."""
    if level not in (2, 3):
        return runs
    from d500.training.score import scaled
    from d500.training.seeds import split
    return scaled([{**r, "status": "missed"} if r["status"] == "interrupted" else r
                   for r in split(runs, own_draws=True)[0]])


def _values(runs: list[dict[str, Any]], metric: Metric) -> list[float]:
    """The values a metric takes over an entry's runs: succeeded runs give their figure; a run
    that finished without it (missed target, failed, diverged, timed out) counts as the metric's
    MISSING value (infinity for time-to-accuracy) or not at all; interrupted runs never count."""
    vals = []
    for r in runs:
        if r["status"] in NOT_COUNTED:
            continue
        value = r["figures"].get(metric.name) if r["status"] == "succeeded" else None
        if value is None:
            value = metric.missing
        if value is not None:
            vals.append(float(value))
    return vals
