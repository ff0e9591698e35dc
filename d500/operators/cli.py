"""`d500 op validate|bench OPERATOR`: level 0 from the command line; every case is a ledger run.

OPERATOR is FILE.py:Class or a submission folder (its submission.yaml names the class).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from d500 import threads
from d500.cli import ArgumentParser, count, seconds, seed
from d500.errors import CheckFailed, UsageError
from d500.operators.dtypes import DTYPES
from d500.paths import non_empty

USAGE_EPILOG = """cases: --case FILE (repeatable), or --input-shape (one per input, in ONNX
order) with --attr, or by default every case of the operator's op_type in levels/0-operators/
(or those its submission.yaml enters). Exit: 0 all passed, 1 the operator disagrees with the
reference, 2 bad usage or input."""


def parser(prog: str) -> ArgumentParser:
    p = ArgumentParser(prog=prog, description="Level 0: validate and benchmark a custom operator "
                       "against the ONNX reference.", epilog=USAGE_EPILOG)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_ in (("validate", "check forward and gradients against the reference"),
                        ("bench", "validate, then time it beside the backends' implementations")):
        s = sub.add_parser(name, help=help_, description=help_, epilog=USAGE_EPILOG)
        s.add_argument("operator", type=non_empty("FILE.py:Class or a submission folder"),
                       help="FILE.py:Class or a submission folder")
        s.add_argument("--input-shape", action="append", default=[], metavar="D0,D1,...",
                       help="an input's shape (repeat per input, in ONNX input order)")
        s.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                       help="a node attribute: an int, a float, a comma list or a string")
        s.add_argument("--dtype", choices=DTYPES,
                       help="element type (default: the case's, or float32)")
        s.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
        s.add_argument("--case", action="append", default=[], metavar="FILE.yaml",
                       help="a level-0 case file, or a rulebook case name (repeatable)")
        s.add_argument("--directions", type=count, default=3,
                       help="random directions per input in the gradient check (default 3)")
        s.add_argument("--json", action="store_true", help="print the results as JSON")
        if name == "bench":
            s.add_argument("--backends", default=None,
                           help="comma list of backends to time beside the operator "
                                "(default: every installed one)")
            s.add_argument("--budget", type=seconds, default=None,
                           help="seconds of timing per implementation (default: the case's)")
            threads.add_option(s)
    return p


def main(argv: list[str], prog: str = "d500 op") -> int:
    args = parser(prog).parse_args(argv)
    check_arguments(args)
    from d500.operators.base import load
    from d500.operators.compile import CompileError
    try:
        loaded = load(args.operator, isolated=True)
        if loaded.cls.framework == "c":
            from d500.operators.base import source_path
            from d500.operators.compile import build
            build(source_path(loaded.cls))
    except CompileError as err:
        print(err.output.rstrip(), file=sys.stderr)
        raise
    cases = resolve_cases(loaded, args)
    check_cases(cases)
    if args.command == "validate":
        return _validate(loaded, cases, args)
    return _bench(loaded, cases, args)


# -- cases -------------------------------------------------------------------------------------
def parse_shape(text: str) -> tuple[int, ...]:
    if text.strip() in ("", "scalar"):
        return ()
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        dims = (-1,)
    if any(d < 0 for d in dims):
        raise UsageError(f"--input-shape '{text}': expected sizes >= 0 separated by commas, "
                         f"e.g. 2,3,8,8")
    return dims


def parse_attr(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise UsageError(f"--attr '{text}': expected NAME=VALUE, e.g. pads=1,1,1,1")
    items = [v.strip() for v in value.split(",")] if "," in value else None
    parsed: Any
    if items is not None:
        try:
            parsed = [int(v) for v in items]
        except ValueError:
            try:
                parsed = [float(v) for v in items]
            except ValueError:
                raise UsageError(f"--attr '{text}': a list must hold numbers only") from None
        return name.strip(), parsed
    for kind in (int, float):
        try:
            return name.strip(), kind(value)
        except ValueError:
            continue
    return name.strip(), value


def check_arguments(args: Any) -> None:
    """The command line's own mistakes (an --attr, an --input-shape, a case name, a backend
    name), said before the operator loads: a C operator compiles first, a Python one starts its
    host process, and `--backends torch,tensorflw` was refused 5 s later."""
    for text in args.attr:
        parse_attr(text)
    for text in args.input_shape:
        parse_shape(text)
    if args.case and args.input_shape:
        raise UsageError("give either --case or --input-shape, not both")
    if args.attr and not args.input_shape:
        raise UsageError("--attr needs --input-shape (a case file sets its own attributes)")
    if args.case:
        from d500.operators.level import LEVEL
        for name in args.case:
            LEVEL.find(name)
    if args.command == "bench":
        from d500 import backends
        backends.select(args.backends)


def resolve_cases(loaded: Any, args: Any) -> list:
    from d500.operators.reference import check_arity, describe
    from d500.operators.workloads import Case, cases_for, load_case
    op_type = loaded.cls.op_type
    attrs = dict(parse_attr(a) for a in args.attr)
    if args.input_shape:
        shapes = [parse_shape(s) for s in args.input_shape]
        check_arity(op_type, len(shapes), loaded.cls.opset)
        dtype = args.dtype or "float32"
        name = f"{describe(op_type, attrs, shapes)} {dtype}"
        return [Case(name, op_type, shapes, attrs, dtype, opset=loaded.cls.opset)]
    if args.case:
        from d500.operators.level import LEVEL
        cases = [load_case(LEVEL.find(p)) for p in args.case]  # a file, or a rulebook case name
        for c in cases:
            if c.op_type != op_type:
                raise UsageError(f"{c.path}: a {c.op_type} case, but {loaded.cls.__name__} "
                                 f"implements {op_type}")
    else:
        cases = cases_for(op_type, loaded.workloads)
        if not cases:
            raise UsageError(f"no level-0 case for {op_type} in levels/0-operators/; "
                             f"give --input-shape (one per input) or --case")
    if args.dtype:
        for c in cases:
            if c.dtype != args.dtype:
                c.name, c.dtype = f"{c.name}-{args.dtype}", args.dtype
    return cases


def check_cases(cases: list) -> None:
    """The reference must accept every case (shapes, attributes) before any run starts."""
    import numpy as np

    from d500.operators.reference import infer_outputs
    for c in cases:
        with c.named():
            infer_outputs(c.op_type, c.attributes, [np.zeros(s, c.np_dtype) for s in c.shapes],
                          1, c.opset)


# -- running (the library records; this prints) ---------------------------------------------
def _options(args: Any):
    from d500.operators.validate import Options
    return Options(seed=args.seed, directions=args.directions)


def _validate(loaded: Any, cases: list, args: Any) -> int:
    from d500.operators.run import validate_cases
    reports = []
    for report, run_id in validate_cases(loaded, cases, _options(args)):
        reports.append((report, run_id))
        if not args.json:
            print(report.text() + f"\n  ledger run {run_id}", flush=True)
    if args.json:
        print(json.dumps([{**r.to_dict(), "run_id": rid} for r, rid in reports], indent=2,
                         default=str))
    failed = [r for r, _ in reports if not r.passed]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(reports)} case(s) failed; "
                          f"{failed[0].case}: {failed[0].summary()}")
    return 0


def _bench(loaded: Any, cases: list, args: Any) -> int:
    from d500 import backends as _backends
    from d500 import progress
    from d500.operators.run import bench_cases, default_backends
    from d500.provenance import peak_flops
    names = default_backends() if args.backends is None else _backends.select(args.backends)
    for b in names:
        _backends.get(b)  # not installed: a usage error now, not mid-run
    own = [] if loaded.cls.framework == "c" else [loaded.cls.framework]
    with progress.shown("d500 op bench"):
        frameworks = threads.frameworks(names, own)
        progress.step(f"loading the frameworks to set their threads: {', '.join(frameworks)}")
        threads.configure(args.threads, frameworks)
        progress.step("this machine's peak FLOP/s (measured once, then cached)")
        peak = peak_flops()
    results = []
    benched = bench_cases(loaded, cases, names, _options(args), args.budget, peak=peak)
    while True:
        with progress.shown("d500 op bench"):  # a case said nothing for ~30 s at load 6
            result = next(benched, None)
        if result is None:
            break
        results.append(result)
        if not args.json:
            print(result.text(), flush=True)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2, default=str))
    elif peak:
        print(f"peak: {peak_flops() / 1e9:.1f} GFLOP/s (measured float32 GEMM, d500.provenance)")
    failed = [r for r in results if r.operator_failed]
    if failed:
        raise CheckFailed(f"{loaded.submission} failed on {len(failed)} of "
                          f"{len(results)} case(s) and is not ranked; {failed[0].case.name}: "
                          f"{failed[0].rows[0].error}")
    return 0
