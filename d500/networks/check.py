"""`d500 net check`: run one ONNX model on several backends with the same inputs and compare every
output with the reference backend's (or, where the reference cannot run it, the majority's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from d500.errors import D500Error, UnsupportedOperator, describe
from d500.networks.compare import Comparison, compare

BASELINE = "reference"


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
    precision: str | None = None  # the lower dtype a mode computes in (openvino:bf16)

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
    from d500.networks import hosted
    backend = hosted.backend(name)  # a third-party one in a host of its own, once hosted
    t0 = time.perf_counter()
    try:
        exe = backend.prepare(model)
        outputs = [np.asarray(o) for o in exe.run(feeds)]
    except UnsupportedOperator as err:
        return BackendResult(name, "unsupported", error=str(err), unsupported=err,
                             seconds=time.perf_counter() - t0)
    except D500Error as err:
        return BackendResult(name, "error", error=str(err), seconds=time.perf_counter() - t0)
    except Exception as err:  # noqa: BLE001 - a backend crash is a result to report, not a crash
        return BackendResult(name, "error", error=describe(err), seconds=time.perf_counter() - t0)
    return BackendResult(name, "ok", outputs=outputs, seconds=time.perf_counter() - t0,
                         precision=getattr(exe, "precision", None))


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backends: Sequence[str], *,
          model_name: str = "", seed: int | None = None, rtol: float | None = None,
          progress: Callable[[str], Any] | None = None,
          recorder: Recorder | None = None) -> CheckReport:
    """Run `model` on `backends` (the reference is always run too, as the baseline) and compare.
    With a `recorder`, every checked backend's ledger run is open before the first backend runs
    and sealed as soon as its verdict is known (at once when the reference is the baseline)."""
    names = list(dict.fromkeys([BASELINE, *backends]))
    requested = list(dict.fromkeys(backends))
    output_names = [o.name for o in model.graph.output]
    inputs = {k: list(v.shape) for k, v in feeds.items()}
    results: dict[str, BackendResult] = {}
    if recorder is not None:
        recorder.open([n for n in requested if n != BASELINE], inputs, seed)
    try:
        for name in names:
            if progress is not None:
                progress(name)
            result = results[name] = run_backend(name, model, feeds)
            reference = results[BASELINE]
            if reference.status != "ok":
                continue  # the verdict waits for the baseline the majority decides
            _compare(result, reference, output_names, rtol)
            if recorder is not None and name != BASELINE:
                recorder.seal(result, BASELINE, "reference")
        if progress is not None:
            progress("")
        baseline, kind = _baseline(results, output_names, rtol)
        if kind != "reference":
            for result in results.values():
                if result.status == "ok" and baseline is not None:
                    _compare(result, results[baseline], output_names, rtol)
        report = CheckReport(model_name, baseline, kind, inputs, seed,
                             [results[n] for n in names], output_names, requested=requested)
        report.note = _note(report)
        if recorder is not None:
            recorder.finish(report)
    except BaseException as err:
        if recorder is not None:
            recorder.abandon(err)
        raise
    return report


def _compare(result: BackendResult, baseline: BackendResult, output_names: list[str],
             rtol: float | None) -> None:
    """Compare one backend's outputs, output by output, with the baseline's."""
    if result.status != "ok":
        return
    result.comparisons = [compare(n, got, want, rtol, result.precision) for n, got, want in
                          zip(output_names, result.outputs, baseline.outputs)]
    if len(result.outputs) != len(output_names):
        result.comparisons.append(Comparison(
            "<outputs>", np.inf, np.inf, 0.0, False,
            f"{len(result.outputs)} outputs instead of {len(output_names)}"))


class Recorder:
    """The ledger runs of one check, one level-1 run per checked backend (workload
    `check:<model file stem>` unless named): all opened before the first backend runs, so a
    process killed mid-way leaves the backends already judged sealed and the others
    interrupted; a backend that disagrees or fails is a failed run. The reference as baseline
    has no run of its own; where it could not run the model, it is a failed run if it was asked
    for, and the backend the majority agrees with is a succeeded run (verdict "baseline")."""

    def __init__(self, model_path: Path, ledger: Any = None, workload: str | None = None):
        from d500.ledger import Ledger
        self.ledger = ledger if ledger is not None else Ledger()
        self.model_path = model_path
        self.workload = workload or f"check:{model_path.stem}"
        self.runs: dict[str, Any] = {}
        self.sealed: dict[str, int] = {}  # backend -> run id, in the order sealed
        self.inputs: dict[str, list[int]] = {}
        self.seed: int | None = None

    def open(self, backends: Sequence[str], inputs: dict[str, list[int]],
             seed: int | None) -> None:
        self.inputs, self.seed = inputs, seed
        for name in backends:
            self._start(name, BASELINE)

    def _start(self, backend: str, baseline: str | None) -> Any:
        run = self.ledger.start_run(level=1, workload=self.workload, submission=backend,
                                    backend=backend, seed=self.seed,
                                    hyperparameters={"baseline": baseline},
                                    model_file=self.model_path)
        self.runs[backend] = run
        return run

    def seal(self, r: BackendResult, baseline: str | None, kind: str) -> None:
        """Seal one backend's run with its verdict against the baseline."""
        run = self.runs.get(r.backend) or self._start(r.backend, baseline)
        figures = {}
        if r.max_rel is not None and r.max_rel != float("inf"):
            figures["agreement"] = r.max_rel
        details = {"baseline": baseline, "baseline_kind": kind, "inputs": self.inputs,
                   "verdict": r.verdict, "comparisons": [c.as_dict() for c in r.comparisons]}
        status = "succeeded" if r.agrees else "failed"
        error = None if r.agrees else (r.error or _disagreement(r))
        run.finish(status, figures=figures, details=details, error=error)
        self.sealed.setdefault(r.backend, run.id)

    def finish(self, report: CheckReport) -> None:
        """Seal what the final report decides: every checked backend not sealed yet; the
        backend the majority chose as baseline agrees with the others by definition."""
        for r in report.checked:
            if r.backend in self.sealed:
                continue
            if r.backend == report.baseline:
                run = self.runs.get(r.backend)
                if run is not None:  # it was asked for: it is the majority's answer
                    run.finish("succeeded", details={
                        "baseline": report.baseline, "baseline_kind": report.baseline_kind,
                        "inputs": self.inputs, "verdict": f"baseline ({report.baseline_kind})"})
                    self.sealed[r.backend] = run.id
                continue
            self.seal(r, report.baseline, report.baseline_kind)

    def abandon(self, err: BaseException) -> None:
        """The check stopped with an exception: the runs not sealed end interrupted (Ctrl-C)
        or failed, with the error."""
        status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        for name, run in self.runs.items():
            if name not in self.sealed:
                run.finish(status, error=describe(err))


def record(report: CheckReport, model_path: Path, ledger: Any = None,
           workload: str | None = None) -> list[int]:
    """Record a finished check afterwards (`check(..., recorder=Recorder(...))` records as it
    goes): one level-1 ledger run per checked backend; the run ids."""
    recorder = Recorder(model_path, ledger, workload)
    recorder.inputs, recorder.seed = report.input_shapes, report.seed
    recorder.finish(report)
    return list(recorder.sealed.values())


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
    best = min(ran, key=lambda r: (-votes[r.backend], _tie_rank(r.backend)))
    return best.backend, "majority"


def _tie_rank(name: str) -> int:
    """Who stands for the majority when the reference cannot run a model and backends tie:
    the lower its framework's `tie_rank` (d500.backends.hooks), the sooner; a framework's
    default mode only, other modes and unranked frameworks last."""
    from d500 import backends
    fw = None if backends.split(name)[1] else backends.about(name)
    return LAST if fw is None or fw.tie_rank is None else fw.tie_rank


LAST = 1 << 30  # the tie rank of a backend none is given


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
