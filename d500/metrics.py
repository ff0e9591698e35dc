"""Metric definitions, loaded by name from the top-level `metrics/` folder (one small file each).

A metric file sets NAME (= its file name), UNIT, DIRECTION ("lower"/"higher" is better),
AGGREGATE ("median" or "olympic_mean", over repetitions and seeds), MISSING (what a run that
did not record it counts as: None or float("inf")), FORMAT (a format spec, "duration" or "bytes"),
MEASURED (how it is measured), optionally REPETITIONS (the run details that hold the timing of
its repetitions, d500.timing.Timing.summary(): a row says when they spread widely) and
MACHINE_DEPENDENT (whether its value depends on the hardware
that measured it: times, rates and ratios of times such as a speed-up; by default true exactly
when UNIT is "s" or a unit per second). The leaderboard ranks and formats only through these.
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from d500.errors import ConfigError, D500Error, listed
from d500.paths import scoring

AGGREGATIONS = ("median", "olympic_mean")
_cache: dict[Path, Metric] = {}


@dataclass(frozen=True)
class Metric:
    """One metric: how it is named, measured, compared, aggregated and printed."""

    name: str
    unit: str
    direction: str
    aggregate: str
    missing: float | None
    format_spec: str
    measured: str
    description: str
    path: Path
    machine_dependent: bool = False  # only comparable between runs on the same hardware
    repetitions: tuple[str, ...] = ()  # run details holding the timing of its repetitions

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower"

    def sort_key(self, value: float | None) -> float:
        """A key that sorts the best value first (None and NaN last)."""
        if value is None or math.isnan(value):
            return math.inf
        return value if self.lower_is_better else -value

    def best(self, values: Iterable[float]) -> float | None:
        finite = [v for v in values if v is not None and not math.isnan(v)]
        if not finite:
            return None
        return min(finite) if self.lower_is_better else max(finite)

    def ratio_to_best(self, value: float | None, best: float | None) -> float | None:
        """How many times worse than the best (1.0 = the best), whichever the direction."""
        if value is None or best is None or math.isnan(value):
            return None
        if math.isinf(value) or math.isinf(best):
            return 1.0 if value == best else math.inf
        if self.lower_is_better:
            return value / best if best > 0 else (1.0 if value == best else math.inf)
        return best / value if value > 0 else math.inf

    def format(self, value: float | None, unit: bool = True) -> str:
        """The value as the leaderboard prints it (with its unit)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if self.format_spec in NAMED_FORMATS:
            return NAMED_FORMATS[self.format_spec](value)
        text = format(value, self.format_spec)
        return f"{text} {self.unit}" if unit and self.unit else text

    @property
    def label(self) -> str:
        arrow = "↓" if self.lower_is_better else "↑"
        return f"{self.name} ({self.unit}) {arrow}" if self.unit else f"{self.name} {arrow}"


def format_bytes(n: float) -> str:
    """Bytes with a decimal prefix: 950 B, 207 kB, 1.5 MB, 3.2 GB."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}B"
    return f"{n:.3g} B"


def format_duration(seconds: float) -> str:
    """Seconds with an SI prefix: 12.3 µs, 4.56 ms, 7.89 s; minutes/hours past 100 s."""
    a = abs(seconds)
    if a == 0:
        return "0 s"
    if a < 1e-6:
        return f"{seconds * 1e9:.3g} ns"
    if a < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if a < 1:
        return f"{seconds * 1e3:.3g} ms"
    if a < 100:
        return f"{seconds:.3g} s"
    if a < 6000:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


NAMED_FORMATS = {"duration": format_duration, "bytes": format_bytes}  # FORMAT names, not specs


def folders() -> list[Path]:
    """Where metric files are looked up: $D500_METRICS (os.pathsep-separated) then metrics/."""
    extra = [Path(p) for p in os.environ.get("D500_METRICS", "").split(os.pathsep) if p]
    return [*extra, scoring()]


def names() -> list[str]:
    """Every defined metric name, sorted."""
    found = {p.stem for d in folders() if d.is_dir() for p in d.glob("*.py")
             if not p.stem.startswith("_")}
    return sorted(found)


def get(name: str, where: str | Path | None = None) -> Metric:
    """The metric called `name`; an unknown name is a D500Error naming it (and `where` it came
    from, e.g. a workload file: then it is a ConfigError)."""
    path = next((d / f"{name}.py" for d in folders()
                 if isinstance(name, str) and name.isidentifier() and (d / f"{name}.py").is_file()),
                None)
    if path is None:
        known = listed(name, names())
        if where is not None:
            raise ConfigError(f"{where}: unknown metric '{name}' (defined in metrics/: {known})")
        raise D500Error(f"unknown metric '{name}' (defined in metrics/: {known})")
    if path not in _cache:
        _cache[path] = _load(path)
    return _cache[path]


def check(metric_names: Sequence[str], where: str | Path | None = None) -> list[Metric]:
    """Every name must be a defined metric; returns their definitions."""
    return [get(n, where) for n in metric_names]


def timed_unit(unit: str) -> bool:
    """Whether a unit is a time ("s") or a rate (a unit per second, e.g. samples/s, GFLOP/s):
    the default of MACHINE_DEPENDENT."""
    return unit == "s" or unit.endswith("/s")


def _load(path: Path) -> Metric:
    spec = importlib.util.spec_from_file_location(f"d500_metric_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as err:  # noqa: BLE001 - a broken metric file is a ConfigError naming it
        raise ConfigError(f"{path}: cannot load metric definition: {err}") from None

    def need(attr: str, types: type | tuple, choices: tuple | None = None):
        if not hasattr(module, attr):
            raise ConfigError(f"{path}: metric definition lacks {attr}")
        value = getattr(module, attr)
        if not isinstance(value, types) or (choices and value not in choices):
            allowed = f" (one of {', '.join(map(str, choices))})" if choices else ""
            raise ConfigError(f"{path}: {attr} = {value!r} is not valid{allowed}")
        return value

    name = need("NAME", str)
    if name != path.stem:
        raise ConfigError(f"{path}: NAME = {name!r} must equal the file name {path.stem!r}")
    missing = getattr(module, "MISSING", None)
    if missing is not None and not isinstance(missing, (int, float)):
        raise ConfigError(f"{path}: MISSING must be None or a number")
    fmt = getattr(module, "FORMAT", ".4g")
    if fmt not in NAMED_FORMATS:
        try:
            format(1.0, fmt)
        except (ValueError, TypeError):
            raise ConfigError(f"{path}: FORMAT = {fmt!r} is not a format spec or one of "
                              f"{', '.join(map(repr, NAMED_FORMATS))}") from None
    unit = need("UNIT", str)
    dependent = getattr(module, "MACHINE_DEPENDENT", timed_unit(unit))
    if not isinstance(dependent, bool):
        raise ConfigError(f"{path}: MACHINE_DEPENDENT = {dependent!r} is not valid (True or "
                          "False)")
    return Metric(
        name=name, unit=unit, direction=need("DIRECTION", str, ("lower", "higher")),
        aggregate=getattr(module, "AGGREGATE", "median"),
        missing=None if missing is None else float(missing), format_spec=fmt,
        measured=need("MEASURED", str), description=(module.__doc__ or "").strip(), path=path,
        machine_dependent=dependent, repetitions=tuple(getattr(module, "REPETITIONS", ())))


def aggregate(values: Sequence[float], how: str) -> float | None:
    """Median, or MLPerf's olympic mean (drop the single best and worst, average the rest;
    plain mean below three values). Never the best value alone."""
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vals:
        return None
    if how == "median":
        return float(statistics.median(vals))
    if how == "olympic_mean":
        kept = vals[1:-1] if len(vals) >= 3 else vals
        if any(math.isinf(v) for v in kept):
            return math.inf if math.inf in kept else -math.inf
        return float(sum(kept) / len(kept))
    raise D500Error(f"unknown aggregation '{how}' (choose from {', '.join(AGGREGATIONS)})")


def spread(values: Sequence[float]) -> tuple[float, float] | None:
    """(min, max) of the values: the spread printed beside every aggregate."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return (min(vals), max(vals)) if vals else None
