"""Level 0 runs recorded in the ledger: validate or benchmark an operator on its cases, one
ledger run per case and implementation, opened before the work starts and sealed after."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

from d500.operators.validate import Options


def hyperparameters(case: Any, mode: str, options: Options) -> dict[str, Any]:
    """What a level-0 run records as its settings."""
    return {"mode": mode, "op_type": case.op_type, "shapes": [list(s) for s in case.shapes],
            "attributes": case.attributes, "dtype": case.dtype,
            "directions": options.directions, "scales": list(options.scales)}


def validate_cases(loaded: Any, cases: Sequence[Any], options: Options, ledger: Any = None
                   ) -> Iterator[tuple[Any, int]]:
    """Validate the operator on each case; yields (report, ledger run id) as each is sealed.
    A case the reference rejects raises before its run opens (bad input, nothing recorded)."""
    from d500.ledger import Ledger
    from d500.operators.validate import prepare, validate

    ledger = ledger if ledger is not None else Ledger()
    for case in cases:
        prepared = prepare(case, options.seed)
        with ledger.start_run(level=0, workload=case.name, submission=loaded.submission,
                              backend=loaded.cls.framework, seed=options.seed,
                              hyperparameters=hyperparameters(case, "validate", options),
                              workload_file=case.path, submission_files=loaded.files) as run:
            report = validate(loaded.cls, case, options, loaded.submission, prepared)
            details = {"validation": report.to_dict()}
            if report.passed:
                run.record(figures=report.figures(), details=details)
            else:
                run.finish("failed", figures=report.figures(), details=details,
                           error=report.summary())
        yield report, run.id


def bench_cases(loaded: Any, cases: Sequence[Any], backends: Sequence[str], options: Options,
                budget: float | None = None, ledger: Any = None, peak: float | None = None
                ) -> Iterator[Any]:
    """Validate, then time the operator beside each backend's own implementation, case by case,
    forward and backward (figures `latency` and `backward_latency` of the same run); yields each
    case's result once its runs are sealed (row.run_id set). Every entry's run is
    open while they are timed, so a process killed mid-way leaves them interrupted, not
    missing. An operator that fails validation is recorded as failed and never ranked."""
    from d500.ledger import Ledger
    from d500.operators.bench import BUILTIN, bench
    from d500.provenance import LoadWatch, peak_flops

    ledger = ledger if ledger is not None else Ledger()
    peak = peak_flops() if peak is None else peak
    entries = [(loaded.submission, loaded.cls.framework), *((BUILTIN, b) for b in backends)]
    for case in cases:
        with ExitStack() as stack:
            runs = [stack.enter_context(ledger.start_run(
                level=0, workload=case.name, submission=submission, backend=backend,
                seed=options.seed, hyperparameters=hyperparameters(case, "bench", options),
                workload_file=case.path,
                submission_files=loaded.files if submission == loaded.submission else []))
                for submission, backend in entries]
            watch = LoadWatch()  # how busy the machine was while this case was timed
            result = bench(loaded.cls, case, list(backends), loaded.submission, options,
                           budget, peak)
            load = watch.finish()
            peak = _beaten(result.rows, peak)
            for row, run in zip(result.rows, runs, strict=True):
                details = {"timing": row.timing, "backward_timing": row.backward_timing,
                           "backward": row.backward_note, "flops_per_call": result.flops,
                           "peak_flops": peak, "validation": row.validation,
                           "load_average": load}
                if row.status == "ok":
                    run.record(figures=row.figures, details=details)
                else:
                    run.finish("failed", figures=row.figures, details=details, error=row.error)
                row.run_id = run.id
        yield result


def _beaten(rows: list, peak: float) -> float:
    """A row faster than the peak proves the peak was measured low (on a loaded machine): it is
    measured again at once (the higher kept while loaded) and every row's fraction taken of it;
    a fraction still over 100 % is no figure, dropped with its reason in the row's timing."""
    from d500.provenance import peak_flops
    if not peak or not any(r.figures.get("peak_fraction", 0) > 100 for r in rows):
        return peak
    peak = peak_flops(refresh=True)
    for row in rows:
        if "peak_fraction" not in row.figures:
            continue
        row.figures["peak_fraction"] = 100.0 * row.figures["gflops"] * 1e9 / peak
        if row.figures["peak_fraction"] > 100:
            del row.figures["peak_fraction"]
            row.timing["peak_note"] = (f"{row.figures['gflops']:.3g} GFLOP/s, above the "
                                       f"machine's peak measured again ({peak / 1e9:.3g}): "
                                       "the machine was loaded")
    return peak


def default_backends() -> list[str]:
    """The backends an operator is timed beside by default: every installed one, the NumPy
    reference last."""
    from d500 import backends
    return [b for b in backends.installed()  # a hosted one only at level 1 (README)
            if b != "reference" and not backends.hosted(b)] + ["reference"]
