"""Conformance results as ledger runs: each `d500 conformance` is one level-1 run, opened before
the suite starts and sealed with its counts; a backend's conformance on a machine is its latest
complete run there.

    outcomes, run_id = record("torch")              # the whole node suite: a complete run
    record("reference", ["Relu"])                   # --op: a partial run, never counted
    latest_by(ledger, key)      # key(run) -> Count of the latest complete run, in one query;
                                # the summary keys (backend, machine): no count crosses machines

A complete run is workload `onnx-node-suite`; a partial one `onnx-node-suite:Relu+Softmax` (its
operators in the name, so the leaderboard never aggregates different selections together), with
`partial: true` in its details. A run killed mid-suite stays `interrupted` and counts for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

WORKLOAD = "onnx-node-suite"
SUBMISSION = "conformance"
LEVEL = 1


@dataclass(frozen=True)
class Count:
    """A backend's conformance as its latest complete recorded run says."""

    backend: str
    run_id: int
    passed: int
    failed: int
    unsupported: int
    total: int
    started: str  # ISO time the run started
    onnx_version: str | None
    opset: int | None

    @property
    def date(self) -> str:
        return self.started[:10]


def canonical(ops: Sequence[str]) -> list[str]:
    """Operator names as ONNX spells them (the CLI accepts any case), sorted, repeats dropped."""
    from d500.conformance import _schema_names
    spelled = {name.lower(): name for name in _schema_names()}
    return sorted({spelled.get(op.lower(), op) for op in ops}, key=str.lower)


def workload_name(ops: Sequence[str] | None) -> str:
    """`onnx-node-suite`, or `onnx-node-suite:Op1+Op2` for a partial run over those operators."""
    return f"{WORKLOAD}:{'+'.join(canonical(ops))}" if ops else WORKLOAD


def record(backend: str, ops: Sequence[str] | None = None, ledger: Any = None,
           tests: list | None = None, progress: bool = True, device: str = "CPU",
           jobs: int = 1) -> tuple[list[Any], int]:
    """Run the node tests (every one, or those of `ops`; `tests` when already selected) on one
    backend as one ledger run: open before the first test, sealed `succeeded` with the counts
    when the suite has run (failing tests are figures, not a failed run). Returns the outcomes
    and the run id."""
    import onnx
    import onnx.defs

    from d500 import backends
    from d500.conformance import RANDOM_OUTPUT, run_suite, select
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    cls = backends.get(backend)
    tests = select(ops) if tests is None else tests
    partial = bool(ops)
    chosen = canonical(ops) if ops else None
    versions = {"onnx_version": onnx.__version__, "opset": onnx.defs.onnx_opset_version()}
    with ledger.start_run(level=LEVEL, workload=workload_name(ops), submission=SUBMISSION,
                          backend=backend, hyperparameters={"ops": chosen, "device": device,
                                                            **versions}) as run:
        outcomes = run_suite(backend, tests=tests, progress=progress, device=device, jobs=jobs)
        by_status = {s: sorted(o.test for o in outcomes if o.status == s)
                     for s in ("pass", "fail", "unsupported")}
        run.record(figures={"node_tests_passed": len(by_status["pass"]),
                            "node_tests_failed": len(by_status["fail"]),
                            "node_tests_unsupported": len(by_status["unsupported"]),
                            "node_tests_total": len(outcomes)},
                   details={"partial": partial, "ops": chosen, **versions, "device": device,
                            "framework_version": cls.version(),
                            # a lower dtype the mode computes in: its float outputs judged at
                            # that dtype's tolerance (d500.tolerances.node_test); None: the tests'
                            "judged_at": cls.precision(),
                            "left_out": f"random-output tests ({RANDOM_OUTPUT.pattern})",
                            "failed_tests": by_status["fail"],
                            "unsupported_tests": by_status["unsupported"]})
    return outcomes, run.id


def _count(run: dict[str, Any]) -> Count | None:
    """The conformance a run records, when it is a complete, succeeded conformance run (not a
    `d500 reproduce` run: that re-checks a package's run, it is not one of the ledger's own)."""
    figures, details = run["figures"], run["details"]
    if (run["status"] != "succeeded" or run["workload"] != WORKLOAD
            or run["submission"] != SUBMISSION or details.get("partial", True)
            or details.get("reproduction")
            or "node_tests_passed" not in figures or "node_tests_total" not in figures):
        return None
    return Count(run["backend"], run["id"], int(figures["node_tests_passed"]),
                 int(figures.get("node_tests_failed", 0)),
                 int(figures.get("node_tests_unsupported", 0)), int(figures["node_tests_total"]),
                 run["started"], details.get("onnx_version"), details.get("opset"))


def latest_by(ledger: Any, key: Callable[[dict[str, Any]], Hashable]) -> dict[Any, Count]:
    """The latest complete conformance run (by start time) of each `key(run record)`, e.g. a
    (backend, machine) pair, from one query."""
    found: dict[Any, tuple[float, Count]] = {}
    for run in ledger.runs(level=LEVEL, workload=WORKLOAD, status="succeeded"):
        count = _count(run)
        if count is None:
            continue
        k = key(run)
        if k not in found or run["started_unix"] >= found[k][0]:
            found[k] = (run["started_unix"], count)
    return {k: count for k, (_, count) in found.items()}

