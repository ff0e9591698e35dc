"""Level 0 in `d500 reproduce`: a packaged operator run (`d500 op validate`, or `d500 op bench`)
validated again here with its recorded case, seed, directions and input scales, and its verdict
compared; its forward and gradient errors are rounding of the machine (BLAS blocking, vector
width), so they are shown beside the verdict, not judged: the verdict (within the case's
tolerance or not) is what must not depend on the machine. A bench run is benched again (the
validation, then the timing, at the case's time budget), and on the run's own hardware
d500.competition.reproduce makes its latencies a check (reproduce_time.latency_checks): a
latency forged in the figures and the MLLOG alike and re-sealed passes `d500 check`.
"""

from __future__ import annotations

from typing import Any

from d500.competition.reproduce_compare import Check

ERRORS = ("forward_error", "gradient_error")


def run(job: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """Validate the job's operator on its case into `ledger` (in the reproduction's process);
    the result as d500.competition.reproduce_job reports it, plus `passed`."""
    from d500.operators.base import load, source_path
    from d500.operators.run import validate_cases
    from d500.operators.validate import Options
    from d500.operators.workloads import Case, load_case

    loaded = load(job["submission"], isolated=True)
    if loaded.cls.framework == "c":
        from d500.operators.compile import build
        build(source_path(loaded.cls))
    hp = job["params"]
    if job["workload"] is not None:
        case = load_case(job["workload"])
        if case.dtype != hp["dtype"]:  # `--dtype` on a case file: as d500 op names it
            case.name, case.dtype = job["case"], hp["dtype"]
    else:  # a case given by --input-shape/--attr
        case = Case(job["case"], hp["op_type"], [tuple(s) for s in hp["shapes"]],
                    dict(hp["attributes"]), hp["dtype"], opset=loaded.cls.opset)
    options = Options(seed=int(job["seed"]), directions=int(hp["directions"]),
                      scales=tuple(float(s) for s in hp["scales"]))
    if hp.get("mode") == "bench":  # as `d500 op bench` ran it: validated, then timed
        from d500.operators.run import bench_cases
        result = next(iter(bench_cases(loaded, [case], [], options, ledger=ledger)))
        row = result.rows[0]
        return {"run_id": row.run_id, "status": "succeeded" if row.status == "ok" else "failed",
                "figures": row.figures, "error": row.error, "passed": result.report.passed}
    report, run_id = next(iter(validate_cases(loaded, [case], options, ledger=ledger)))
    return {"run_id": run_id, "status": "succeeded" if report.passed else "failed",
            "figures": report.figures(), "error": "" if report.passed else report.summary(),
            "passed": report.passed}


def checks(origin: Any, result: dict[str, Any]) -> list[Check]:
    """The verdict of the origin's validation against this one's, the errors beside it."""
    recorded = (origin.details.get("validation") or {}).get("passed")
    if recorded is None:
        recorded = origin.status == "succeeded"
    again = bool(result.get("passed"))
    figures = result.get("figures") or {}
    shown = [f"{name} {_e(origin.figures.get(name))} -> {_e(figures.get(name))}"
             for name in ERRORS if name in origin.figures or name in figures]
    verdict = {True: "passed", False: "failed"}
    note = "; ".join(shown)
    return [Check("validation", verdict[bool(recorded)], verdict[again],
                  "the same verdict (errors are this machine's rounding: shown, not judged)",
                  bool(recorded) == again, note)]


def _e(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2e}"
