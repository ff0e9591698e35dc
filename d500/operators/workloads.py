"""Level-0 workloads (one operator case per YAML file in levels/0-operators/) and submissions."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from d500.errors import ConfigError, UsageError
from d500.operators.dtypes import DTYPES, numpy_dtype
from d500.operators.level import LEVEL
from d500.workload import COMMON, Field, check_metrics, level_field, load

LEVEL_DIR = LEVEL.rulebook()
# What `d500 op validate|bench` measures; a case lists a subset of these.
MEASURED = ("latency", "backward_latency", "gflops", "peak_fraction", "forward_error",
            "gradient_error")

SCHEMA = {
    **COMMON,
    "level": level_field(0),
    "operator": Field(str, required=True, help="the ONNX operator (default domain)"),
    "opset": Field(int, help="the opset (default: the newest the installed onnx knows)"),
    "inputs": Field(list, required=True,
                    help="one entry per input, in ONNX order: a shape [d0, d1, ...] or "
                         "{shape: [...], low: x, high: y} for inputs with a valid range"),
    "attributes": Field(dict, default={}, help="the node's attributes"),
    "dtype": Field(str, default="float32", choices=DTYPES),
    "time_budget": Field(float, default=2.0,
                         help="seconds of timing per implementation in `d500 op bench`"),
}

SUBMISSION_SCHEMA = {
    "name": Field(str, required=True, help="the entry's name, as it shows on the leaderboard"),
    "level": Field(int, required=True, choices=(0,)),
    "description": Field(str, default=""),
    "authors": Field(list, default=[], items=str),
    "operator": Field(str, required=True, help="FILE.py:Class, relative to this file"),
    "workloads": Field(list, items=str,
                       help="level-0 case names it enters (default: every case of its op_type)"),
}


@dataclass
class Case:
    """One operator case: op, input shapes (and value ranges), attributes, dtype."""

    name: str
    op_type: str
    shapes: list[tuple[int, ...]]
    attributes: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    ranges: list[tuple[float, float] | None] = field(default_factory=list)
    opset: int | None = None
    time_budget: float = 2.0
    path: Path | None = None
    metrics: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ranges:
            self.ranges = [None] * len(self.shapes)

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @contextmanager
    def named(self) -> Iterator[None]:
        """A UsageError of this case (the reference refusing its shapes or attributes) names
        its case file first, where it has one: it named only 'Conv(8x16x32x32, ...)'."""
        try:
            yield
        except UsageError as err:
            if self.path is None or str(err).startswith(str(self.path)):
                raise
            raise UsageError(f"{self.path}: {err}") from None


def load_case(path: str | Path) -> Case:
    """Read and validate one level-0 workload file."""
    path = Path(path)
    data = load(path, SCHEMA)
    check_metrics(data, path, MEASURED, 0)
    if not (data["time_budget"] > 0 and math.isfinite(data["time_budget"])):
        raise ConfigError(f"{path}: field 'time_budget' must be a positive number of seconds")
    shapes, ranges = [], []
    for i, item in enumerate(data["inputs"]):
        where = f"inputs[{i}]"
        low = high = None
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"shape", "low", "high"})
            if unknown:
                raise ConfigError(f"{path}: unknown field '{where}.{unknown[0]}' "
                                  f"(allowed: shape, low, high)")
            low, high, item = item.get("low"), item.get("high"), item.get("shape")
            if (low is None) != (high is None) or not all(
                    isinstance(v, (int, float)) for v in (low or 0, high or 0)):
                raise ConfigError(f"{path}: field '{where}' needs numbers for both low and high")
            if low is not None and not low < high:
                raise ConfigError(f"{path}: field '{where}': low must be below high")
        if not isinstance(item, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in item):
            raise ConfigError(f"{path}: field '{where}' must be a shape, a list of sizes >= 0")
        shapes.append(tuple(item))
        ranges.append(None if low is None else (float(low), float(high)))
    for key, value in data["attributes"].items():
        if not _attribute_ok(value):
            raise ConfigError(f"{path}: field 'attributes.{key}' must be a number, a string or "
                              f"a list of numbers")
    from onnx import defs
    if not defs.has(data["operator"]):
        from d500.operators.base import operator_hint
        hint = operator_hint(data["operator"])
        raise ConfigError(f"{path}: field 'operator': '{data['operator']}' is not an ONNX "
                          f"operator" + (f" ({hint})" if hint else ""))
    return Case(name=data["name"], op_type=data["operator"], shapes=shapes,
                attributes=dict(data["attributes"]), dtype=data["dtype"], ranges=ranges,
                opset=data["opset"], time_budget=data["time_budget"], path=path.resolve(),
                metrics=list(data["metrics"]))


def _attribute_ok(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, str)):
        return True
    return isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


def all_cases(directory: Path = LEVEL_DIR) -> list[Case]:
    return [load_case(p) for p in sorted(Path(directory).glob("*.yaml"))]


def cases_for(op_type: str, names: list[str] | None = None, directory: Path = LEVEL_DIR
              ) -> list[Case]:
    """Every case of `op_type` (restricted to `names` when given)."""
    found = [c for c in all_cases(directory) if c.op_type == op_type]
    if names is not None:
        by_name = {c.name: c for c in found}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise UsageError(f"no {op_type} case named '{missing[0]}' in {directory}")
        found = [by_name[n] for n in names]
    return found


def load_submission(path: str | Path) -> dict[str, Any]:
    """A level-0 submission.yaml, with `operator` split into its file and class."""
    path = Path(path)
    data = load(path, SUBMISSION_SCHEMA)
    file, sep, cls = data["operator"].rpartition(":")
    if not sep or not file:
        raise ConfigError(f"{path}: field 'operator' must be FILE.py:Class")
    data["operator_file"] = (path.parent / file).resolve()
    data["operator_class"] = cls
    return data
