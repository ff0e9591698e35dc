"""Benchmark an operator beside each backend's own implementation of the same ONNX operator.

Every implementation is first checked against the reference (the operator fully, a backend on
its forward); one that fails is reported failed and never timed or ranked. The others are timed
side by side (d500.timing.measure_interleaved): warm-up, then samples until the 95% CI of the
median is within 5% or the time budget ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from d500 import tolerances
from d500.errors import D500Error
from d500.operators import flops
from d500.operators.adapters import runner
from d500.operators.base import CustomOperator
from d500.operators.reference import infer_outputs, typed_node_model
from d500.operators.validate import Options, Report, compare, prepare, validate
from d500.operators.workloads import Case

BUILTIN = "builtin"  # the submission name of a backend's own implementation


@dataclass
class Row:
    """One implementation of one case: its check, its timing and its figures."""

    submission: str
    backend: str
    status: str                      # "ok" | "failed"
    figures: dict[str, float] = field(default_factory=dict)
    timing: dict[str, Any] | None = None
    error: str = ""
    validation: dict[str, Any] | None = None
    run_id: int | None = None

    def line(self) -> str:
        label = f"{self.submission} [{self.backend}]"
        if self.status != "ok" or not self.timing:
            return f"  {label:<34} FAILED: {self.error}"
        t = self.timing
        gf = self.figures.get("gflops")
        pk = self.figures.get("peak_fraction")
        extra = (f"  {gf:8.3g} GFLOP/s" if gf is not None else "") + (
            f"  {pk:6.3g}% of peak" if pk is not None else "")
        ci = t["ci95"]
        conv = "" if t["target_met"] else "  (budget ended before the CI reached 5%)"
        return (f"  {label:<34} median {_ms(t['median'])}  IQR {_ms(t['iqr'])}"
                f"  95% CI [{_ms(ci[0])}, {_ms(ci[1])}]  n={t['repetitions']}x{t['number']}"
                f"{extra}{conv}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.4f} ms"


@dataclass
class CaseResult:
    case: Case
    report: Report
    rows: list[Row]
    flops: float | None

    @property
    def operator_failed(self) -> bool:
        return not self.report.passed

    def text(self) -> str:
        head = f"{self.case.name}: {self.case.op_type} {self.case.dtype}" + (
            f", {self.flops / 1e9:.4g} GFLOP per call" if self.flops else "")
        return "\n".join([head, *(r.line() for r in self.rows)])

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case.name, "op_type": self.case.op_type, "dtype": self.case.dtype,
                "flops": self.flops, "rows": [asdict(r) for r in self.rows]}


def bench(op_class: type[CustomOperator], case: Case, backends: list[str],
          submission: str, options: Options | None = None, budget: float | None = None,
          peak: float | None = None) -> CaseResult:
    """Validate, then time the operator and every backend's implementation on one case."""
    options = options or Options()
    prepared = prepare(case, options.seed)
    inputs = [a.copy() for a in prepared.inputs]
    expected = prepared.expected[0]
    report = validate(op_class, case, options, submission, prepared)
    outs = infer_outputs(case.op_type, case.attributes, inputs, 1, case.opset)
    n_flops = flops.count(case.op_type, case.attributes, [a.shape for a in inputs],
                          [shape for _, shape in outs])
    rows: list[Row] = []
    calls: dict[int, Callable[[], Any]] = {}
    mine = Row(submission, op_class.framework, "ok" if report.passed else "failed",
               dict(report.figures()), error="" if report.passed else report.summary(),
               validation=report.to_dict())
    rows.append(mine)
    if report.passed:
        run = runner(op_class(**case.attributes))
        native = run.to_native(inputs)
        calls[0] = lambda: run.call(native)
    rtol, atol = tolerances.operator_forward(case.np_dtype)
    for name in backends:
        row, call = _backend(name, case, inputs, expected, rtol, atol)
        rows.append(row)
        if call is not None:
            calls[len(rows) - 1] = call
    if calls:
        from d500.timing import measure_interleaved
        timings = measure_interleaved({str(i): fn for i, fn in calls.items()},
                                      budget=budget if budget is not None else case.time_budget)
        for key, timing in timings.items():
            row = rows[int(key)]
            row.timing = timing.summary()
            row.figures["latency"] = timing.median
            if n_flops:
                row.figures["gflops"] = n_flops / timing.median / 1e9
                if peak:
                    row.figures["peak_fraction"] = 100.0 * n_flops / timing.median / peak
    return CaseResult(case, report, rows, n_flops)


def _backend(name: str, case: Case, inputs: list[np.ndarray], expected: np.ndarray,
             rtol: float, atol: float) -> tuple[Row, Callable[[], Any] | None]:
    from d500 import backends
    row = Row(BUILTIN, name, "failed")
    try:
        exe = backends.get(name).prepare(typed_node_model(case.op_type, case.attributes,
                                                          inputs, 1, case.opset))
        got = exe.run(inputs)[0]
    except D500Error as err:
        row.error = _first_line(str(err))
        return row, None
    except Exception as err:  # noqa: BLE001 - a backend crashing on a case is a failed entry
        row.error = _first_line(f"{type(err).__name__}: {err}")
        return row, None
    check = compare("output", "Y", got, expected, rtol, atol)
    row.figures["forward_error"] = check.max_rel if math.isfinite(check.max_rel) else 1e300
    if not check.passed:
        row.error = (f"forward disagrees with the reference (max rel error {check.max_rel:.2e}, "
                     f"{check.mismatches} mismatches)")
        return row, None
    row.status = "ok"
    return row, lambda: exe.run(inputs)


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."
