"""`d500 net check|bench|list`: level 1 from the command line (tables with rich, or --json)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from d500 import threads
from d500.cli import ArgumentParser, seconds, seed, stdout_console
from d500.errors import UsageError
from d500.paths import non_empty

CHECK_HELP = """Run an ONNX model on several backends with the same seeded inputs and compare
every output with the reference backend (or, where the reference cannot run the model, with the
backend most others agree with). Open input dimensions get 2 for the leading (batch) axis and
32 for any other (override with --dim NAME=SIZE). Tolerance: max|a-b| <= rtol * max|b| per
output (rtol 1e-3 for float32, 1e-9 float64, 2e-2 half precision; integers exact).
Exit 0 when all agree, 1 when a backend disagrees or fails, 2 for bad input or an operator a
backend lacks."""


def backend_list(text: str | None) -> list[str]:
    """`--backends a,b,c` (default: every installed backend), each checked to exist."""
    from d500 import backends
    return backends.select(text)


def main(argv: list[str], prog: str = "d500 net") -> int:
    parser = ArgumentParser(prog=prog, description="Level 1: check and benchmark ONNX networks "
                            "across backends.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p_check = sub.add_parser("check", help="compare a model's outputs across backends",
                             description=CHECK_HELP)
    p_check.add_argument("model", type=non_empty("an ONNX file"), help="an ONNX file")
    p_check.add_argument("--backends", help="comma-separated (default: every installed one)")
    p_check.add_argument("--inputs", metavar="FILE.npz", type=non_empty("an .npz file"),
                         help="input arrays by input name")
    p_check.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    p_check.add_argument("--dim", action="append", metavar="NAME=SIZE",
                         help="size of a named open input dimension (repeatable)")
    p_check.add_argument("--rtol", type=float, help="override the tolerance (scale-relative)")
    p_check.add_argument("--random-weights", action="store_true",
                         help="replace weights the graph fills with one constant "
                              "(ConstantOfShape) by seeded random ones (--seed)")
    p_check.add_argument("--json", action="store_true", help="print the report as JSON")
    p_check.add_argument("--no-record", action="store_true",
                         help="do not record the comparison in the ledger")
    p_bench = sub.add_parser("bench", help="time a level-1 workload on several backends")
    p_bench.add_argument("workload", help="a levels/1-networks/*.yaml file or workload name")
    p_bench.add_argument("--backends", help="comma-separated (default: every installed one)")
    p_bench.add_argument("--budget", type=seconds,
                         help="seconds of timing per measurement and backend (default: the "
                              "workload's)")
    threads.add_option(p_bench)
    p_bench.add_argument("--json", action="store_true", help="print the results as JSON")
    sub.add_parser("list", help="list the level-1 workloads")
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command == "bench":
        return _bench(args)
    return _list()


# ------------------------------------------------------------------ check

def _check(args: Any) -> int:
    from d500 import backends
    from d500.model import load
    from d500.networks import inputs
    from d500.networks.check import Recorder, check
    from d500.networks.workloads import FOLDER

    backends.host_plugins()  # a third-party backend runs in a host (d500.networks.hosted)
    if args.rtol is not None and not args.rtol > 0:
        raise UsageError("--rtol must be positive")
    if args.inputs and args.dim:
        raise UsageError("--dim sizes random inputs; with --inputs the file's arrays set them")
    names = backend_list(args.backends)
    path = Path(args.model)
    if not path.exists() and (FOLDER / f"{path.name}.yaml").is_file():
        raise UsageError(f"{path}: no such file; '{path.name}' is a level-1 workload: `d500 net "
                         f"bench {path.name}` checks and times it, `net check` takes an ONNX file")
    if path.suffix in (".yaml", ".yml") and path.is_file():
        raise UsageError(f"{path}: a YAML file; `net check` takes an ONNX file (`d500 net bench "
                         f"WORKLOAD.yaml` checks and times a level-1 workload's model)")
    model = load(path)
    recorded = path
    if args.random_weights:
        from d500.networks.weights import randomize
        model, count = randomize(model, args.seed)
        if not count:
            raise UsageError(f"{path}: --random-weights found no ConstantOfShape-filled weights "
                             f"to replace")
        from d500.networks.workloads import cached_model
        recorded = cached_model(model, f"{path.stem}-random{args.seed}")  # what ran
    feeds = (inputs.load_npz(args.inputs, model) if args.inputs
             else inputs.make(model, args.seed, dims=inputs.parse_dims(args.dim)))
    recorder = None if args.no_record else Recorder(recorded, workload=f"check:{path.stem}")
    with _status(not args.json, "d500 net check") as status:
        report = check(model, feeds, names, model_name=str(path),
                       seed=None if args.inputs else args.seed, rtol=args.rtol,
                       progress=lambda b: status(f"running {path.name} on {b}" if b else ""),
                       recorder=recorder)
    from d500.networks.weights import constant_weights
    constant = 0 if args.random_weights else constant_weights(model)
    if constant:
        report.note = " ".join(filter(None, [report.note, (
            f"{constant} weight tensor(s) are one constant filled in the graph "
            f"(ConstantOfShape), so the outputs hardly depend on the arithmetic; "
            f"--random-weights makes this check meaningful")]))
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print_check(report)
    if report.exit_code == 2:
        raise report.first_unsupported()  # type: ignore[misc]
    return report.exit_code


def print_check(report, console=None) -> None:
    from rich.table import Table

    console = console or stdout_console()
    table = Table(title=f"net check {report.model}", title_justify="left")
    for col in ("backend", "output", "max abs", "max rel", "tolerance", "verdict"):
        table.add_column(col, justify="right" if col.startswith(("max", "tol")) else "left")
    for r in report.results:
        style = {"agrees": "green", "DISAGREES": "red"}.get(r.verdict, "yellow")
        if r.backend == report.baseline:
            table.add_row(r.backend, "(all)", "", "", "", f"baseline ({report.baseline_kind})")
            continue
        if r.status != "ok":
            table.add_row(r.backend, "", "", "", "",
                          f"[{style}]{r.verdict}[/]: {_short(r.error)}")
            continue
        if not r.comparisons:
            table.add_row(r.backend, "", "", "", "", "[yellow]ran; nothing to compare with[/]")
        for c in r.comparisons:
            verdict = ("agrees" if c.ok else "DISAGREES") + (f": {c.note}" if c.note else "")
            table.add_row(r.backend, c.output, f"{c.max_abs:.3g}", f"{c.max_rel:.3g}",
                          f"{c.rtol:g}", f"[{'green' if c.ok else 'red'}]{verdict}[/]")
    console.print(table)
    shapes = ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}"
                       for k, v in report.input_shapes.items())
    seed = f", seed {report.seed}" if report.seed is not None else ", from --inputs"
    console.print(f"inputs: {shapes}{seed}", highlight=False, soft_wrap=True)
    if report.note:
        console.print(f"note: {report.note}", highlight=False, soft_wrap=True)
    verdict = {0: "[green]all backends agree[/]", 1: "[red]a backend disagrees or failed[/]",
               2: "[yellow]a backend lacks an operator of this model[/]"}[report.exit_code]
    console.print(verdict)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# ------------------------------------------------------------------ bench

# Where a timed figure's summary (with its confidence interval) sits in a run's details.
CI_DETAIL = {"latency": "latency", "throughput": "throughput", "train_step_time": "train_step"}

def _bench(args: Any) -> int:
    from d500 import backends
    from d500.networks import workloads
    from d500.networks.bench import bench

    backends.host_plugins()  # a third-party backend runs in a host (d500.networks.hosted)
    workload = workloads.load(workloads.find(args.workload))
    names = backend_list(args.backends)
    with _status(not args.json, "d500 net bench") as status:  # threads set after the model's checks
        result = bench(workload, names, budget=args.budget, progress=status,
                       configure=lambda: threads.configure(args.threads,
                                                           threads.frameworks(names)))
    if args.json:
        print(json.dumps([{"backend": r.backend, "status": r.status, "run": r.run_id,
                           "figures": r.figures, "error": r.error} for r in result.results],
                         indent=1))
    else:
        print_bench(result)
    if result.exit_code == 2:
        raise next(r.unsupported for r in result.results if r.unsupported is not None)
    return result.exit_code


def print_bench(result, console=None) -> None:
    """The recorded figures side by side, with each one's ratio to the best backend."""
    from rich.table import Table

    from d500 import metrics

    console = console or stdout_console()
    wl = result.workload
    defs = [metrics.get(n) for n in wl.metrics]
    table = Table(title=f"net bench {wl.name} ({wl.model_label()}, batch {wl.batch_size})",
                  title_justify="left")
    table.add_column("backend")
    table.add_column("run", justify="right")
    for m in defs:
        unit = "" if m.format_spec == "duration" else m.unit
        arrow = "↓" if m.lower_is_better else "↑"
        table.add_column(f"{m.name.replace('_', ' ')}\n{unit} {arrow}".rstrip(), justify="right")
    table.add_column("status")
    ok = [r for r in result.results if r.status == "succeeded"]
    best = {m.name: m.best(r.figures[m.name] for r in ok if m.name in r.figures) for m in defs}
    for r in sorted(result.results, key=lambda r: (
            r.status != "succeeded", defs[[m.name for m in defs].index(wl.rank_by)].sort_key(
                r.figures.get(wl.rank_by)))):
        cells = []
        for m in defs:
            value = r.figures.get(m.name)
            ratio = m.ratio_to_best(value, best[m.name]) if r.status == "succeeded" else None
            extra = (f" ×{ratio:.3g}" if ratio is not None and ratio != 1.0
                     and m.name != "agreement" and not math.isnan(ratio) else "")
            ci = r.details.get(CI_DETAIL.get(m.name, ""), {}).get("ci95_rel")
            spread = f" ±{ci:.0%}" if value is not None and ci is not None and ci < 10 else ""
            cells.append(m.format(value, unit=False) + spread + extra)
        status = "[green]ok[/]" if r.status == "succeeded" else f"[red]{r.status}[/]"
        table.add_row(r.backend, str(r.run_id or ""), *cells, status)
    console.print(table)
    for r in result.results:
        if r.error:
            console.print(f"[red]{r.backend}[/]: {_short(r.error, 300)}", highlight=False,
                          soft_wrap=True)
    console.print(f"ranked by {wl.rank_by}; ±p = half-width of the 95% confidence interval of "
                  f"the median; ×N = N times worse than the best; recorded in the ledger "
                  f"(d500 leaderboard --level 1 --workload {wl.name})", highlight=False,
                  soft_wrap=True)  # whole in a pipe or a log


def _list() -> int:
    from d500.networks import workloads
    for path in workloads.all_files():
        wl = workloads.load(path)
        train = ", training step" if wl.train else ""
        print(f"{wl.name:<24} {wl.model_label()}, batch {wl.batch_size}{train}  "
              f"[{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}]")
    return 0


# ------------------------------------------------------------------ progress

class _status:
    """d500.progress's spinner with a changing description on stderr, `title` before it (silent
    when `show` is false; rich's own stood still while TensorFlow loaded)."""

    def __init__(self, show: bool, title: str):
        import contextlib

        from d500 import progress
        self._shown = progress.shown(title) if show else contextlib.nullcontext()

    def __enter__(self):
        self._shown.__enter__()
        return self

    def __call__(self, text: str) -> None:
        from d500 import progress
        progress.step(text)

    def __exit__(self, *exc: object) -> None:
        self._shown.__exit__(*exc)
