"""`d500 net check`: run one ONNX model on several backends with the same inputs and compare every
output with the reference backend's (or, where the reference cannot run it, the majority's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from d500.errors import D500Error, UnsupportedOperator, describe
from d500.networks.compare import Comparison, compare

BASELINE = "reference"
# Who stands for the majority when the reference cannot run a model and backends tie.
PREFERENCE = ("reference", "onnxruntime", "torch", "tensorflow")


@dataclass
class BackendResult:
    """What one backend did with the model."""

    backend: str
    status: str  # "ok" | "unsupported" | "error"
    outputs: list[np.ndarray] | None = None
    error: str = ""
    unsupported: UnsupportedOperator | None = None
    seconds: float = 0.0  # prepare + one run
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Ran and was compared, output by output, within tolerance."""
        return self.status == "ok" and bool(self.comparisons) and all(
            c.ok for c in self.comparisons)

    @property
    def max_rel(self) -> float | None:
        if self.status != "ok" or not self.comparisons:
            return None
        return max(c.max_rel for c in self.comparisons)

    @property
    def verdict(self) -> str:
        if self.status == "unsupported":
            return "unsupported"
        if self.status == "error":
            return "error"
        if not self.comparisons:
            return "not compared"
        return "agrees" if self.agrees else "DISAGREES"


@dataclass
class CheckReport:
    """Every backend's outputs compared with the baseline."""

    model: str
    baseline: str | None  # the backend every other is compared with
    baseline_kind: str  # "reference" | "majority" | "none"
    input_shapes: dict[str, list[int]]
    seed: int | None
    results: list[BackendResult]
    output_names: list[str]
    note: str = ""

    requested: list[str] = field(default_factory=list)  # the backends asked for

    @property
    def checked(self) -> list[BackendResult]:
        """The results that decide the verdict: the requested backends (the reference, when not
        requested, is only the baseline)."""
        return [r for r in self.results if r.backend in self.requested] or self.results

    @property
    def exit_code(self) -> int:
        """0 all agree, 1 one disagrees or fails, 2 a backend lacks an operator."""
        if any(r.status == "unsupported" for r in self.checked):
            return 2
        if self.baseline is None or any(not r.agrees for r in self.checked):
            return 1
        return 0

    def first_unsupported(self) -> UnsupportedOperator | None:
        return next((r.unsupported for r in self.checked if r.status == "unsupported"), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "baseline": self.baseline, "baseline_kind": self.baseline_kind,
            "inputs": self.input_shapes, "seed": self.seed, "outputs": self.output_names,
            "agree": self.exit_code == 0, "exit_code": self.exit_code, "note": self.note,
            "requested": self.requested,
            "backends": [{
                "backend": r.backend, "status": r.status, "verdict": r.verdict,
                "error": r.error, "seconds": r.seconds,
                "max_rel": r.max_rel if r.max_rel is None or np.isfinite(r.max_rel)
                else str(r.max_rel),
                "comparisons": [c.as_dict() for c in r.comparisons]} for r in self.results]}


def run_backend(name: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray]
                ) -> BackendResult:
    """Prepare and run the model on one backend; failures become a status, not an exception."""
    from d500.backends import get
    backend = get(name)
    t0 = time.perf_counter()
    try:
        outputs = [np.asarray(o) for o in backend.prepare(model).run(feeds)]
    except UnsupportedOperator as err:
        return BackendResult(name, "unsupported", error=str(err), unsupported=err,
                             seconds=time.perf_counter() - t0)
    except D500Error as err:
        return BackendResult(name, "error", error=str(err), seconds=time.perf_counter() - t0)
    except Exception as err:  # noqa: BLE001 - a backend crash is a result to report, not a crash
        return BackendResult(name, "error", error=describe(err), seconds=time.perf_counter() - t0)
    return BackendResult(name, "ok", outputs=outputs, seconds=time.perf_counter() - t0)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backends: Sequence[str], *,
          model_name: str = "", seed: int | None = None, rtol: float | None = None,
          progress: Callable[[str], Any] | None = None) -> CheckReport:
    """Run `model` on `backends` (the reference is always run too, as the baseline) and compare."""
    names = list(dict.fromkeys([BASELINE, *backends]))
    results: dict[str, BackendResult] = {}
    for name in names:
        if progress is not None:
            progress(name)
        results[name] = run_backend(name, model, feeds)
    if progress is not None:
        progress("")
    output_names = [o.name for o in model.graph.output]
    baseline, kind = _baseline(results, output_names, rtol)
    for result in results.values():
        if result.status == "ok" and baseline is not None:
            result.comparisons = [
                compare(n, got, want, rtol) for n, got, want in
                zip(output_names, result.outputs, results[baseline].outputs)]
            if len(result.outputs) != len(output_names):
                result.comparisons.append(Comparison(
                    "<outputs>", np.inf, np.inf, 0.0, False,
                    f"{len(result.outputs)} outputs instead of {len(output_names)}"))
    report = CheckReport(model_name, baseline, kind,
                         {k: list(v.shape) for k, v in feeds.items()}, seed,
                         [results[n] for n in names], output_names,
                         requested=list(dict.fromkeys(backends)))
    report.note = _note(report)
    return report


def record(report: CheckReport, model_path: Path, ledger: Any = None,
           workload: str | None = None) -> list[int]:
    """One level-1 ledger run per backend (workload `check:<model file stem>` unless named):
    its agreement with the baseline; a backend that disagrees or fails is a failed run."""
    from d500.ledger import Ledger
    ledger = ledger if ledger is not None else Ledger()
    ids = []
    for r in report.checked:
        if r.backend == report.baseline:
            continue
        run = ledger.start_run(level=1, workload=workload or f"check:{model_path.stem}",
                               submission=r.backend, backend=r.backend, seed=report.seed,
                               hyperparameters={"baseline": report.baseline},
                               model_file=model_path)
        figures = {}
        if r.max_rel is not None and r.max_rel != float("inf"):
            figures["agreement"] = r.max_rel
        details = {"baseline": report.baseline, "baseline_kind": report.baseline_kind,
                   "inputs": report.input_shapes, "verdict": r.verdict,
                   "comparisons": [c.as_dict() for c in r.comparisons]}
        status = "succeeded" if r.agrees else "failed"
        error = None if r.agrees else (r.error or _disagreement(r))
        run.finish(status, figures=figures, details=details, error=error)
        ids.append(run.id)
    return ids


def _disagreement(r: BackendResult) -> str:
    bad = [c for c in r.comparisons if not c.ok]
    if not bad:
        return "no baseline to compare with"
    c = bad[0]
    return (f"output '{c.output}' disagrees with the baseline: max rel error {c.max_rel:.3g} "
            f"> {c.rtol:g}" + (f" ({c.note})" if c.note else ""))


def _agree(a: BackendResult, b: BackendResult, output_names: list[str],
           rtol: float | None) -> bool:
    return (len(a.outputs or []) == len(b.outputs or []) == len(output_names) and all(
        compare(n, x, y, rtol).ok for n, x, y in zip(output_names, a.outputs, b.outputs)))


def _baseline(results: dict[str, BackendResult], output_names: list[str],
              rtol: float | None) -> tuple[str | None, str]:
    ran = [r for r in results.values() if r.status == "ok"]
    if results.get(BASELINE) is not None and results[BASELINE].status == "ok":
        return BASELINE, "reference"
    if len(ran) < 2:  # one backend alone has nothing to agree with
        return None, "none"
    votes = {r.backend: sum(_agree(r, o, output_names, rtol) for o in ran if o is not r)
             for r in ran}
    order = {n: i for i, n in enumerate(PREFERENCE)}
    best = min(ran, key=lambda r: (-votes[r.backend], order.get(r.backend, len(order))))
    return best.backend, "majority"


def _note(report: CheckReport) -> str:
    ok = [r for r in report.results if r.status == "ok" and r.backend != report.baseline]
    if report.baseline_kind == "none":
        ran = [r.backend for r in report.results if r.status == "ok"]
        return ("no backend could run the model" if not ran else
                f"only {ran[0]} could run the model: there is nothing to compare it with")
    if report.baseline_kind == "majority":
        ref = next((r for r in report.results if r.backend == BASELINE), None)
        why = f" ({ref.verdict}: {ref.error})" if ref is not None and ref.error else ""
        return (f"the reference could not run the model{why}; compared with "
                f"'{report.baseline}', the backend most others agree with")
    others = [r for r in ok if r.backend != BASELINE]
    if len(others) >= 2 and not any(r.agrees for r in others):
        agree_pairwise = all(_agree(a, b, report.output_names, None)
                             for a in others for b in others if a is not b)
        if agree_pairwise:
            names = ", ".join(r.backend for r in others)
            return (f"{names} agree with each other but not with the reference: the reference "
                    f"may be wrong here")
    return ""
