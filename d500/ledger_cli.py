"""`d500 ledger list|show|export|verify|import`: read the recorded runs, check their integrity,
merge a competitor's package (d500.ledger.imports)."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser, stdout_console
from d500.errors import D500Error, UsageError
from d500.paths import non_empty, output_file, write_output
from d500.say import say

STATUS_STYLE = {"succeeded": "green", "running": "cyan", "failed": "red", "diverged": "red",
                "missed": "yellow", "timeout": "yellow", "interrupted": "magenta"}
EXPORT_COLUMNS = ("id", "level", "workload", "submission", "backend", "status", "seed",
                  "started", "stopped", "duration", "study", "trial", "environment", "error")


def main(argv: list[str], prog: str = "d500 ledger") -> int:
    from d500.ledger import STATUSES

    parser = ArgumentParser(prog=prog, description="Read and verify the ledger of runs "
                            "($D500_HOME/ledger.sqlite).")
    parser.add_argument("--ledger", metavar="FILE", type=non_empty("a ledger file"),
                        help="a ledger file other than "
                        "$D500_HOME/ledger.sqlite")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p_list = sub.add_parser("list", help="list runs")
    p_list.add_argument("--level", type=int, choices=(0, 1, 2, 3))
    p_list.add_argument("--workload")
    p_list.add_argument("--submission")
    p_list.add_argument("--backend")
    p_list.add_argument("--status", choices=STATUSES)
    p_list.add_argument("--json", action="store_true", help="print a JSON array of runs")
    p_show = sub.add_parser("show", help="show one run in full")
    p_show.add_argument("run", help="the run id, or 'last'")
    p_show.add_argument("--json", action="store_true")
    p_export = sub.add_parser("export", help="export every run")
    p_export.add_argument("--format", choices=("csv", "json", "jsonl"),
                          help="csv (default; json or jsonl where --out's name ends so)")
    p_export.add_argument("--out", metavar="FILE", type=non_empty("a file name"),
                          help="write here instead of stdout")
    p_export.add_argument("--level", type=int, choices=(0, 1, 2, 3))
    p_export.add_argument("--workload")
    sub.add_parser("verify", help="recompute every hash; exit 1 naming what changed")
    said = ("merge a competitor's package (d500 package) into the ledger: checked as `d500 "
            "check` does, refused (exit 1) when it fails; the same package twice is a no-op")
    p_import = sub.add_parser("import", help=said, description=said[0].upper() + said[1:]
                              + ". The ledger: $D500_HOME/ledger.sqlite, or `d500 ledger "
                              "--ledger FILE import PACKAGE`.")
    p_import.add_argument("package", metavar="PACKAGE", type=non_empty("a package file"),
                          help="the package file")
    p_import.add_argument("--force", action="store_true", help="import a package that fails "
                          "the check anyway; its runs are marked forced with its problems")
    p_import.add_argument("--rules", metavar="DIR", help="the rulebook its workload files must "
                          "match (default: the levels/ d500 ships)")
    p_import.add_argument("--verbose", action="store_true", help="list each imported run "
                          "(origin run -> run here) and each run skipped as already held")
    args = parser.parse_args(argv)

    from d500.ledger import Ledger
    from d500.provenance import summary

    if args.command == "import":
        return _import(args.ledger, args.package, args.force, args.rules, args.verbose)
    if args.command == "export":  # its options are said wrong before a missing ledger is
        _export_options(args)
    ledger = Ledger.open_for_reading(args.ledger)
    try:
        if args.command == "list":
            runs = ledger.runs(level=args.level, workload=args.workload, status=args.status,
                               submission=args.submission, backend=args.backend)
            chosen = {k: getattr(args, k) for k in ("level", "workload", "status",
                                                    "submission", "backend")}
            chosen = {k: v for k, v in chosen.items() if v is not None}
            if args.json:
                print(json.dumps([_public(r) for r in runs], indent=1))
                hint = "" if runs else _near(ledger, chosen)
                if hint:  # the JSON stays `[]`; the hint goes to stderr
                    given = " ".join(f"--{k} {v}" for k, v in chosen.items())
                    say(f"{prog} list: no run matches {given} ({hint})")
            else:
                _print_list(runs, ledger, chosen)
        elif args.command == "show":
            if args.run == "last":
                every = ledger.runs()
                if not every:
                    raise UsageError(f"no runs recorded in {ledger.path}")
                args.run = every[-1]["id"]
            run = ledger.get(args.run)
            per_run, general = ledger.verify_runs()
            run["verify"] = per_run.get(run["id"], []) + general
            if args.json:
                print(json.dumps(run, indent=1, default=str))
            else:
                _print_run(run)
        elif args.command == "export":
            runs = ledger.runs(level=args.level, workload=args.workload)
            chosen = {"workload": args.workload} if args.workload else {}
            hint = "" if runs or not chosen else _near(ledger, chosen)
            if hint:  # what is written stays the (empty) export; the hint goes to stderr
                say(f"{prog} export: no run matches --workload {args.workload} ({hint})")
            if args.format != "csv":  # everything: evaluations, artifacts, provenance
                runs = [{**ledger.get(r["id"]), "status": r["status"]} for r in runs]
            else:
                envs = ledger.environments()
                for r in runs:
                    env = envs.get(r["environment"])
                    r["machine"] = summary(env) if env else ""
            text = export(runs, args.format)
            if args.out:
                write_output(args.out, text)
                print(f"wrote {len(runs)} run{'' if len(runs) == 1 else 's'} to {args.out}",
                      file=sys.stderr)
            else:
                sys.stdout.write(text)
        elif args.command == "verify":
            return _verify(ledger)
    finally:
        ledger.close()
    return 0


def _export_options(args: Any) -> None:
    """`ledger export`'s --format from --out's name where not given, and --out checked."""
    if args.format is None:  # `--out runs.json` is JSON, not CSV in that file
        suffix = Path(args.out or "").suffix.lower().lstrip(".")
        if suffix not in ("csv", "json", "jsonl", "txt", ""):  # runs.xlsx got CSV
            raise UsageError(f"{args.out}: --out writes CSV to a name ending in .csv, "
                             f"JSON to .json and JSON lines to .jsonl (--format csv: "
                             f"CSV to any name)")
        args.format = suffix if suffix in ("json", "jsonl") else "csv"
    if args.out:
        output_file(args.out, f"runs.{args.format}")


def _import(path: str | None, package: str, force: bool, rules: str | None,
            verbose: bool = False) -> int:
    """`d500 ledger import`: the package is read (and --rules found) before the ledger, which
    this may create, is opened."""
    from d500.competition.package import Package
    from d500.ledger import Ledger
    from d500.ledger.imports import import_package

    if rules is not None and not Path(rules).is_dir():
        from d500.paths import no_folder
        raise UsageError(f"--rules {rules}: {no_folder(rules)}")
    pkg = Package.open(package)
    with Ledger(path) as ledger:
        done = import_package(ledger, pkg, force=force, rules_dir=rules)
    return _report(done, package, ledger.path, verbose)


def _span(ids: list[int]) -> str:
    """Run ids as "run N", "runs A..B" (consecutive) or "runs A, B, ... (N in all)"."""
    if len(ids) == 1:
        return f"run {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"runs {ids[0]}..{ids[-1]}"
    shown = ", ".join(map(str, ids[:6]))
    return f"runs {shown}{'' if len(ids) <= 6 else f', … ({len(ids)} in all)'}"


def _held(held: dict[int, str]) -> str:
    """Runs held already, in words: "runs 1..6 here, this ledger's own" or "... imported from
    package <sha12>"."""
    by: dict[str, list[int]] = {}
    for run_id, sha in sorted(held.items()):
        by.setdefault(sha, []).append(run_id)
    return "; ".join(f"{_span(ids)} here, " + (f"imported from package {sha}" if sha else
                                                "this ledger's own")
                     for sha, ids in by.items())


def _report(done: Any, package: str, path: Any, verbose: bool = False) -> int:
    """Print what an import did (d500.ledger.imports.Imported): a summary, each run only when
    `verbose`; the exit status."""
    from d500.ledger import iso

    name = f"package {done.sha256[:12]} (entry {done.entry})"
    ids = sorted(done.runs.values())
    span = (f"run {ids[0]}" if len(ids) == 1 else f"runs {ids[0]}..{ids[-1]}") if ids else \
        "no runs"
    if done.status == "refused":
        held = set(done.skipped)  # said once, not a line each (--verbose: each)
        real = [p for p in done.problems if p not in held]
        from d500.say import shown
        for problem in done.problems if verbose else real:
            print(shown(f"{package}: {problem}"))  # as `d500 check` prints them
        if held and not real:  # nothing wrong, nothing new (a package of this very ledger)
            print(f"nothing imported into {path}: {name} brings no run it lacks; its "
                  f"{len(held)} run(s) are held there already with the same origin seal "
                  f"({_held(done.held)}){'' if verbose else '; --verbose names each'}")
            return 1
        if held and not verbose:
            print(f"{package}: {len(held)} run(s) already held with the same origin seal "
                  f"({_held(done.held)}); not imported again")
        print(f"refused {name}: {len(real)} problem(s); nothing imported into {path} (--force "
              "imports it marked as forced)", file=sys.stderr)
        return 1
    if done.status == "already":
        print(f"{name} was already imported into {path} on {iso(done.imported)} as "
              f"package {done.package_id} ({span}"
              f"{', forced' if done.forced else ''}): nothing to do")
        return 0
    if verbose:
        for origin_id, run_id in done.runs.items():
            print(f"  origin run {origin_id} -> run {run_id}")
        for line in done.skipped:
            print(f"  skipped {line}")
    origins = f"; origin {_span(sorted(done.runs))}" if done.runs else ""
    print(f"imported {name} into {path} as package {done.package_id}: {len(ids)} "
          f"run(s) ({span}{origins}), {len(done.studies)} "
          f"stud{'y' if len(done.studies) == 1 else 'ies'}, files under {done.folder}")
    if done.skipped and not verbose:
        print(f"skipped {len(done.skipped)} run(s) already held ({_held(done.held)}; "
              "--verbose names each, and maps each origin run to its run here)")
    elif done.runs and not verbose:
        print("(--verbose maps each origin run to its run here)")
    if done.same_code:
        print(done.same_code)
    if done.forced:
        from d500.say import shown
        print(f"FORCED past {len(done.problems)} problem(s); its runs are marked forced:")
        for problem in done.problems:
            print(shown(f"  {problem}"))
    return 0


def _public(run: dict[str, Any]) -> dict[str, Any]:
    """A run as listed: everything but the workload file's text and internal bookkeeping."""
    return {k: v for k, v in run.items() if k not in ("workload_text",)}


def export(runs: list[dict[str, Any]], fmt: str) -> str:
    """Runs as CSV (one column per figure), a JSON array, or JSON lines."""
    if fmt == "json":
        return json.dumps(runs, indent=1) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in runs)
    figure_names = sorted({name for r in runs for name in r["figures"]})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*EXPORT_COLUMNS, *figure_names, "hyperparameters", "workload_sha256",
                     "model_sha256", "machine"])
    for r in runs:
        writer.writerow([*("" if r[c] is None else r[c] for c in EXPORT_COLUMNS),
                         *(r["figures"].get(n, "") for n in figure_names),
                         json.dumps(r["hyperparameters"], sort_keys=True),
                         r["workload_sha256"] or "", r["model_sha256"] or "",
                         r.get("machine", "")])
    return out.getvalue()


def _figures_text(figures: dict[str, float]) -> str:
    from d500 import metrics

    parts = []
    for name, value in figures.items():
        try:
            parts.append(f"{name}={metrics.get(name).format(value)}")
        except D500Error:  # a metric file removed since: show the raw number
            parts.append(f"{name}={value:g}")
    return ", ".join(parts)


def _print_list(runs: list[dict[str, Any]], ledger: Any,
                filters: dict[str, Any] | None = None) -> None:
    from rich.table import Table

    from d500.ledger.lifecycle import trial_label
    from d500.metrics import format_duration

    console = stdout_console()
    if not runs:
        every = len(ledger.runs()) if filters else 0
        chosen = " ".join(f"--{k} {v}" for k, v in (filters or {}).items())
        hint = _near(ledger, filters or {}) if every else ""
        console.print(f"no run of the {every} in {ledger.path} matches {chosen}"
                      f"{f' ({hint})' if hint else ''}" if every
                      else f"no runs recorded in {ledger.path}", markup=False, highlight=False,
                      soft_wrap=True)
        return
    table = Table(title=f"{len(runs)} run{'' if len(runs) == 1 else 's'} in {ledger.path}",
                  title_justify="left")
    for col in ("id", "lvl", "workload", "submission", "backend", "status", "seed", "started",
                "time", "figures"):
        table.add_column(col, overflow="fold", no_wrap=col in ("id", "lvl", "status", "seed",
                                                               "started", "time"))
    for r in runs:
        style = STATUS_STYLE.get(r["status"], "")
        trial = (f" ({trial_label(r['study_number'], r['trial'], r['study'])})"
                 if r["study"] is not None else "")
        if r["package"] is not None:
            trial += (f" (package {r['package']['sha256'][:12]}"
                      f"{', FORCED' if r['package']['forced'] else ''})")
        table.add_row(str(r["id"]), "" if r["level"] is None else str(r["level"]),
                      r["workload"] or "", (r["submission"] or "") + trial, r["backend"] or "",
                      f"[{style}]{r['status']}[/]", "" if r["seed"] is None else str(r["seed"]),
                      (r["started"] or "")[5:16].replace("T", " "),
                      "" if r["duration"] is None else format_duration(r["duration"]),
                      _figures_text(r["figures"]) or (r["error"] or "")[:80])
    console.print(table)


def _near(ledger: Any, filters: dict[str, Any]) -> str:
    """"did you mean 'conv'?" for the first --workload, --submission or --backend that no
    recorded run has, when a recorded one is close; else ""."""
    from d500.errors import did_you_mean
    runs = ledger.runs()
    for key in ("workload", "submission", "backend"):
        recorded = {r[key] for r in runs if r[key]}
        if key in filters and filters[key] not in recorded:
            return did_you_mean(filters[key], sorted(recorded))
    return ""


def _print_run(run: dict[str, Any]) -> None:
    from rich.table import Table

    from d500.ledger.lifecycle import trial_label
    from d500.provenance import summary

    console = stdout_console(soft_wrap=True)
    style = STATUS_STYLE.get(run["status"], "")
    n = run.get("world_size")  # level 3's
    ranks = f" x{n} rank{'s' if n != 1 else ''}" if n else ""
    console.print(f"[bold]run {run['id']}[/]  level {run['level']}  {run['workload']}  "
                  f"{run['submission']} on {run['backend']}{ranks}  [{style}]{run['status']}[/]")
    fields = [("seed", run["seed"]), ("started", run["started"]), ("stopped", run["stopped"]),
              ("duration (s)", run["duration"]),
              ("trial", trial_label(run["study_number"], run["trial"], run["study"])
               if run["study"] is not None else None),
              ("hyperparameters", json.dumps(run["hyperparameters"], sort_keys=True)),
              ("figures", _figures_text(run["figures"])),
              ("details", json.dumps(run["details"], sort_keys=True, default=str)),
              ("error", run["error"]), ("process", f"pid {run['pid']} on {run['host']}"),
              ("provenance", summary(run["provenance"]) if run["provenance"] else None),
              ("workload file", f"{run['workload_file']}  sha256 {run['workload_sha256']}"
               if run["workload_file"] else None),
              ("model file", f"{run['model_file']}  sha256 {run['model_sha256']}"
               if run["model_file"] else None),
              ("mllog", run["mllog"]),
              ("package", None if run["package"] is None else
               f"{run['package']['entry']} sha256 {run['package']['sha256']}"
               f"{' (FORCED past its check)' if run['package']['forced'] else ''}; origin run "
               f"{run['origin']['run'] if run['origin'] else '?'}")]
    for name, value in fields:
        if value not in (None, "", "{}"):
            console.print(f"  [bold]{name}:[/] {value}", highlight=False)
    if run["submission_files"]:
        console.print("  [bold]submission files:[/]")
        for path, digest in run["submission_files"].items():
            console.print(f"    {path}  sha256 {digest}", highlight=False)
    if run["artifacts"]:
        console.print("  [bold]artifacts:[/]")
        for a in run["artifacts"]:
            console.print(f"    {a['path']}  {a['bytes']} bytes  sha256 {a['sha256']}",
                          highlight=False)
    if run["evaluations"]:
        table = Table(title="evaluations", title_justify="left")
        for col in ("step", "epoch", "wall time (s)", "metrics"):
            table.add_column(col)
        for e in run["evaluations"]:
            table.add_row("" if e["step"] is None else str(e["step"]),
                          "" if e["epoch"] is None else f"{e['epoch']:g}",
                          f"{e['wall_time']:.3f}", _figures_text(e["metrics"]))
        console.print(table)
    if run["verify"]:
        console.print("[red]verify: FAILED[/]")
        for problem in run["verify"]:
            console.print(f"  {problem}", highlight=False)
    elif run["sealed"]:
        console.print("[green]verify: intact[/] (row hash chained, files unchanged)")
    else:
        console.print("verify: not sealed yet (the run has not finished)")


def _verify(ledger: Any) -> int:
    """`d500 ledger verify`: what a user must treat as tampering (a row, a seal, the chain, an
    environment, an artifact under $D500_HOME) one line each, exit 1; then each file outside
    the ledger (workload, model, submission file) that changed or went missing since runs
    recorded it, once per file with those runs: a finding about the file (d500's own rulebook
    and example entries move on between versions), exit 0 when nothing else is wrong."""
    files: list[Any] = []
    per_run, general = ledger.verify_runs(rehash=True, files=files)  # no cache
    about_files = {f.line for f in files}
    problems = general + [p for rid in sorted(per_run) for p in per_run[rid]
                          if p not in about_files]
    for problem in problems:
        print(problem)
    for line in _file_findings(ledger, files):
        print(line)
    if problems:
        bad = sum(1 for ps in per_run.values() if any(p not in about_files for p in ps))
        print(f"ledger {ledger.path}: {len(problems)} problem(s) in {bad} run(s)"
              + (f"; {_changed_files(files)}" if files else ""), file=sys.stderr)
        return 1
    runs = ledger.runs()
    sealed = sum(1 for r in runs if r["sealed"])
    print(f"ledger {ledger.path}: intact ({sealed} sealed runs, {len(runs) - sealed} "
          "not finished)" + (f"; {_changed_files(files)} (above): findings about those "
                             f"files, not the ledger's rows" if files else ""))
    return 0


def _changed_files(files: list[Any]) -> str:
    count = len({f.path for f in files})
    return f"{count} file(s) changed or missing since runs recorded them"


def _file_findings(ledger: Any, files: list[Any]) -> list[str]:
    """One line per file that differs from what runs recorded (d500.ledger.integrity's
    FileFinding), naming the runs and, for d500's own rulebook and example entries (which a
    newer d500 edits), where the recorded text is."""
    from d500.paths import examples, rulebook

    grouped: dict[tuple[str, Path, str | None], list[Any]] = {}
    for f in files:
        grouped.setdefault((f.what, f.path, f.now), []).append(f)
    kept = {r["id"] for r in ledger.runs_by_id(sorted({f.run for f in files}))
            if r["workload_text"]} if files else set()
    out = []
    for (what, path, now), found in grouped.items():
        ids = sorted({f.run for f in found})
        runs = _span(ids)
        recorded = ", ".join(sorted({f"{f.recorded[:12]}…" for f in found}))
        state = ("is missing" if now is None else
                 f"differs from what {runs} recorded (sha256 {recorded} then, {now[:12]}… now)")
        line = f"{what} {path} {state}" + (f"; recorded by {runs}" if now is None else "")
        resolved = path.resolve()
        if resolved.is_relative_to(rulebook()) or resolved.is_relative_to(examples()):
            own = ("d500's own rulebook" if resolved.is_relative_to(rulebook())
                   else "d500's example entry")
            line += f": {own} moved on since (not a change to the ledger)"
            with_text = [i for i in ids if i in kept]
            if what == "workload file" and with_text:
                line += (f"; the text each run ran under is kept in the ledger: `d500 ledger "
                         f"show {with_text[0]} --json` (workload_text)")
            else:
                line += ("; the ledger keeps its sha256 only: the file as it was is in the d500 "
                         "version (git commit) of the run's provenance")
        else:
            line += ": the runs no longer match this file (edited or replaced after they ran)"
        out.append(line)
    return out
