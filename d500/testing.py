"""Helpers for users' own test suites: the level-0 check as a pytest assertion.

    from d500.testing import assert_operator_matches_reference
    def test_my_conv():
        assert_operator_matches_reference(MyConv, [(2, 3, 8, 8), (4, 3, 3, 3)], {"pads": [1] * 4})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from d500.operators.base import CustomOperator, check_class, load
from d500.operators.reference import check_arity, describe
from d500.operators.validate import Options, Report, validate
from d500.operators.workloads import Case, cases_for, load_case


def assert_operator_matches_reference(
        op_class: type[CustomOperator] | str,
        input_shapes: Sequence[Sequence[int]] | None = None,
        attributes: Mapping[str, Any] | None = None, *, dtype: str = "float32", seed: int = 0,
        case: str | Path | None = None, ranges: Sequence[tuple[float, float] | None] | None = None,
        directions: int = 3) -> list[Report]:
    """Validate `op_class` (a class or "FILE.py:Class") like `d500 op validate` does, without
    recording a ledger run; raise AssertionError with the report when it disagrees.

    Cases: `input_shapes` (+ `attributes`, `dtype`, `ranges` per input), or a level-0 workload
    file `case`, or by default every level-0 case of the operator's op_type."""
    if isinstance(op_class, str):
        op_class = load(op_class).cls
    check_class(op_class, getattr(op_class, "__module__", "?"))
    if input_shapes is not None:
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        check_arity(op_class.op_type, len(shapes), op_class.opset)
        attrs = dict(attributes or {})
        cases = [Case(describe(op_class.op_type, attrs, shapes), op_class.op_type, shapes, attrs,
                      dtype, list(ranges) if ranges else [], op_class.opset)]
    elif case is not None:
        cases = [load_case(case)]
    else:
        cases = cases_for(op_class.op_type)
        if not cases:
            raise AssertionError(f"no level-0 case for {op_class.op_type}: give input_shapes")
    reports = []
    for c in cases:
        report = validate(op_class, c, Options(seed=seed, directions=directions))
        if not report.passed:
            raise AssertionError(f"{op_class.__name__} disagrees with the ONNX reference on "
                                 f"{c.name}: {report.summary()}\n{report.text()}")
        reports.append(report)
    return reports
