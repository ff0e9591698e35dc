"""`d500 conformance`: the ONNX backend node test suite against a backend, per operator, in total.

The installed onnx builds its node tests in memory. The 12 tests whose outputs are random
(Bernoulli, training-mode Dropout) are left out: no fixed expected output exists for them.
Outputs are compared exactly as `onnx.backend.test.BackendTest` compares them. Each invocation
is one level-1 ledger run (d500.conformance_runs): the leaderboard's conformance counts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
import unittest
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from d500.cli import ArgumentParser, processes, stdout_console

RANDOM_OUTPUT = re.compile(r"^test_(bernoulli|training_dropout)")


@dataclass
class Outcome:
    test: str
    op: str
    status: str  # pass | fail | unsupported
    detail: str = ""


def node_tests() -> list:
    """The deterministic node tests of the installed onnx (random-output ones left out). onnx
    builds them by running its reference implementations (30-80 s here, however few operators
    are asked for), so they are built once per onnx version and read back from
    $D500_HOME/cache/onnx (0.1 s); a cache that does not read is built again."""
    import os
    import pickle

    import onnx

    from d500 import paths
    path = paths.cache("onnx") / f"node-tests-{onnx.__version__}.pickle"
    try:
        with open(path, "rb") as f:
            return [t for t in pickle.load(f) if not RANDOM_OUTPUT.match(t.name)]
    except Exception:  # noqa: BLE001 - missing, truncated, another onnx's: build them again
        pass
    from onnx.backend.test.loader import load_model_tests

    from d500.say import say
    say(f"building onnx {onnx.__version__}'s node tests (once; cached in {path.parent})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = [t for t in load_model_tests(kind="node") if not RANDOM_OUTPUT.match(t.name)]
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(pickle.dumps(tests, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(path)  # whole or not at all, whoever writes beside this process
    except OSError as err:  # a full disk: the tests are built, only not kept
        say(f"{path}: not cached ({err.strerror})")
    return tests


def _op_of(test) -> str:
    """The operator a node test exercises (an expanded test counts for the function op)."""
    ops = sorted({n.op_type for n in test.model.graph.node}, key=len, reverse=True)
    name = test.name.removeprefix("test_").replace("_", "").lower()
    single = len(ops) == 1 or (len(ops) == 2 and "Constant" in ops and not name.startswith(
        "const"))
    if single and "expanded" not in name:
        return next(op for op in ops if op != "Constant" or len(ops) == 1)
    for op in (*ops, *_schema_names()):  # the longest op name the test is named after
        if name.startswith(op.lower()):
            return op
    for short, op in TEST_NAME_ALIASES.items():
        if name.startswith(short):
            return op
    return ops[-1] if ops else "?"


# Abbreviations in node test names (their expanded forms hold only the constituent ops).
TEST_NAME_ALIASES = {"sce": "SoftmaxCrossEntropyLoss", "nllloss": "NegativeLogLikelihoodLoss",
                     "mvn": "MeanVarianceNormalization", "tril": "Trilu", "triu": "Trilu",
                     "batchnorm": "BatchNormalization", "instancenorm": "InstanceNormalization",
                     "l1normalization": "LpNormalization", "l2normalization": "LpNormalization"}


@functools.cache
def _schema_names() -> tuple[str, ...]:
    import onnx.defs
    names = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    return tuple(sorted(names, key=len, reverse=True))


def run_test(backend, test, device: str = "CPU") -> Outcome:
    """Run one node test as BackendTest does and say how it went."""
    from onnx.backend.test.runner import _normalize_tensor

    from d500.errors import UnsupportedOperator
    op = _op_of(test)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = backend.prepare(test.model, device)
            judge = _harness(rep.precision)
            for inputs, ref_outputs in test.data_sets:
                outputs = rep.run([_normalize_tensor(x) for x in inputs])
                judge.assert_similar_outputs(
                    [_normalize_tensor(x) for x in ref_outputs], outputs,
                    rtol=test.rtol, atol=test.atol)
    except UnsupportedOperator as err:
        return Outcome(test.name, op, "unsupported", str(err))
    except Exception as err:  # noqa: BLE001 - any other failure is a failed test
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return Outcome(test.name, op, "fail", f"{type(err).__name__}: {first}"[:300])
    return Outcome(test.name, op, "pass")


@functools.cache
def _harness(precision: str | None) -> type:
    """onnx's BackendTest, judging as it does; for a mode that computes in a lower `precision`
    (openvino:bf16), each float output at the looser of its test's tolerance and that dtype's
    (d500.tolerances.node_test)."""
    import numpy as np
    from onnx.backend.test import BackendTest

    from d500 import tolerances
    if precision is None:
        return BackendTest

    class Lowered(BackendTest):
        @classmethod
        def assert_similar_outputs(cls, ref_outputs, outputs, rtol, atol, model_dir=None):
            if len(ref_outputs) != len(outputs):
                return super().assert_similar_outputs(ref_outputs, outputs, rtol, atol,
                                                      model_dir=model_dir)
            for want, got in zip(ref_outputs, outputs):
                low_rtol, low_atol = (tolerances.node_test(rtol, atol, want, precision)
                                      if isinstance(want, np.ndarray) else (rtol, atol))
                super().assert_similar_outputs([want], [got], low_rtol, low_atol,
                                               model_dir=model_dir)
            return None

    return Lowered


def select(ops: Sequence[str] | None = None) -> list:
    """The node tests of the operators `ops` (any case), or every one (None or empty)."""
    tests = node_tests()
    if ops:
        wanted = {o.lower() for o in ops}
        tests = [t for t in tests if _op_of(t).lower() in wanted]
    return tests


def run_suite(backend_name: str, ops: list[str] | None = None, progress: bool = True,
              device: str = "CPU", tests: list | None = None, jobs: int = 1
              ) -> list[Outcome]:
    """Every selected node test (`tests`, or those of `ops`) against one backend, in this
    process or spread over `jobs` worker processes (outcomes in the tests' order either way)."""
    tests = select(ops) if tests is None else tests
    bar = None
    if progress and sys.stderr.isatty():
        from rich.progress import Progress
        bar = Progress(transient=True)
    with bar or contextlib.nullcontext():
        task = bar.add_task(f"conformance {backend_name}", total=len(tests)) if bar else None
        advance = (lambda n: bar.advance(task, n)) if bar else (lambda n: None)
        if jobs > 1:
            return _run_in_workers(backend_name, tests, device, jobs, advance)
        from d500 import backends
        backend = backends.get(backend_name)
        outcomes = []
        for t in tests:
            outcomes.append(run_test(backend, t, device))
            advance(1)
        return outcomes


CHUNK = 4  # tests per task handed to a worker: small, so that slow compiles balance out


def _run_in_workers(backend_name: str, tests: list, device: str, jobs: int,
                    advance: Callable[[int], None]) -> list[Outcome]:
    """The tests run by `jobs` spawned processes, a few at a time; each worker reads the cached
    node tests and runs the ones it is handed by name."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    names = [t.name for t in tests]
    chunks = [names[i:i + CHUNK] for i in range(0, len(names), CHUNK)]
    done: dict[str, Outcome] = {}
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_ignore_interrupts)
    try:
        futures = [pool.submit(_run_named, backend_name, chunk, device) for chunk in chunks]
        for future in as_completed(futures):
            outcomes = future.result()
            done.update((o.test, o) for o in outcomes)
            advance(len(outcomes))
    except BaseException:  # ^C, a failed chunk: end the workers now, not after every chunk
        manager = getattr(pool, "_executor_manager_thread", None)  # (shutdown forgets it)
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in set(multiprocessing.active_children()) - before:
            worker.kill()
        _forget(manager)
        raise
    pool.shutdown()
    return [done[n] for n in names]


def _forget(thread: Any) -> None:
    """After a pool's workers were killed: wait for its manager `thread` to end, and take it off
    the list that Python's exit handler wakes (CPython 3.11 writes to each one's wake-up pipe,
    which a broken pool's thread closed: a traceback after the run's last line)."""
    from concurrent.futures import process
    if thread is None:
        return
    thread.join(timeout=5)
    if not thread.is_alive():
        getattr(process, "_threads_wakeups", {}).pop(thread, None)


def _ignore_interrupts() -> None:
    """A worker ignores ^C, which the terminal sends to the whole process group: the parent
    ends the workers. A worker that took it ran on into its next chunk (the pool hands a
    chunk's exception back and goes on), so ^C waited 30 s for the chunks queued, and one
    interrupted while importing torch imported it again and aborted in C++ ('generic_type:
    cannot initialize type GradBucket')."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_named(backend_name: str, names: list[str], device: str) -> list[Outcome]:
    """In a worker: the named node tests against the backend."""
    from d500 import backends
    backend = backends.get(backend_name)
    by_name = _tests_by_name()
    return [run_test(backend, by_name[n], device) for n in names]


@functools.cache
def _tests_by_name() -> dict[str, Any]:
    return {t.name: t for t in node_tests()}


def backend_test_counts(backend_cls, pattern: str = ".*", kind: str = "Node",
                        device: str = "CPU") -> dict[str, object]:
    """Run the official BackendTest harness for one backend; count passes, failures, skips."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = _harness(backend_cls.precision())(backend_cls, __name__)
        bt.exclude(r"test_(bernoulli|training_dropout)")
        bt.include(pattern)
        case = bt.test_cases[f"OnnxBackend{kind}ModelTest"]
        suite = unittest.TestSuite(
            case(name) for name in unittest.TestLoader().getTestCaseNames(case)
            if name.endswith("_" + device.lower()))
        result = unittest.TestResult()
        suite.run(result)
    failed = [t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors]
    return {"run": result.testsRun, "skipped": len(result.skipped),
            "failed": sorted(failed), "passed": result.testsRun - len(failed) - len(
                result.skipped)}


def main(argv: list[str], prog: str) -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="backend name (see `d500 backends`)")
    parser.add_argument("--op", nargs="+", action="extend", metavar="OPTYPE",
                        type=lambda text: [t for t in text.split(",") if t.strip()],
                        help="only these operator types (spaces or commas between them)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--failures", action="store_true", help="list every failing test")
    parser.add_argument("--jobs", type=processes, default=1, metavar="N",
                        help="run the tests in N worker processes (default 1: in this one)")
    args = parser.parse_args(argv)
    from d500 import backends
    from d500.errors import UsageError, did_you_mean
    if args.op is not None:  # --op Relu,Conv as --op Relu Conv
        args.op = [op.strip() for ops in args.op for op in ops]
        if not args.op:
            raise UsageError("--op names no operator (give ONNX operator types: --op Relu Conv)")
    backends.select(args.backend)  # a mistyped name, before its framework loads (5-9 s)
    names = _schema_names()
    known = {name.lower() for name in names}
    unknown = [op for op in args.op or [] if op.lower() not in known]
    if unknown:
        import onnx
        hint = did_you_mean(unknown[0], names)
        raise UsageError(f"unknown operator(s) {', '.join(unknown)}: not ONNX operators known "
                         f"to onnx {onnx.__version__}" + (f" ({hint})" if hint else ""))
    from d500 import progress
    with progress.shown(prog):  # a terminal sees the framework's import (TensorFlow 3-5 s) and
        backends.get(args.backend)  # the suite's reading; not installed: said before the suite
        progress.step("reading onnx's node tests (built once, then cached)")
        tests = select(args.op)
    if args.op and not tests:
        raise UsageError(f"no node test exercises operator(s) {', '.join(args.op)}")
    from d500.conformance_runs import record
    outcomes, run_id = record(args.backend, args.op, tests=tests, progress=not args.json,
                               jobs=args.jobs)
    totals = Counter(o.status for o in outcomes)
    per_op: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        per_op[o.op][o.status] += 1
    if args.json:
        print(json.dumps({"backend": args.backend, "totals": dict(totals),
                          "tests": [asdict(o) for o in outcomes]}, indent=1))
        _say_recorded(run_id, args.op)
        return 0
    from rich.table import Table
    table = Table(title=f"ONNX node tests on backend '{args.backend}'")
    for col in ("operator", "pass", "fail", "unsupported"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for op in sorted(per_op):
        c = per_op[op]
        table.add_row(op, str(c["pass"]), str(c["fail"] or ""), str(c["unsupported"] or ""))
    console = stdout_console()
    console.print(table)
    if args.failures:
        for o in outcomes:
            if o.status != "pass":
                console.print(f"{o.status:<11} {o.test}: {o.detail}", markup=False,
                              highlight=False)
    print(f"total: {len(outcomes)} tests, {totals['pass']} pass, {totals['fail']} fail, "
          f"{totals['unsupported']} unsupported (12 random-output tests left out: "
          f"Bernoulli, training-mode Dropout)")
    _say_recorded(run_id, args.op)
    return 0


def _say_recorded(run_id: int, ops: list[str] | None) -> None:
    """Where the results went, on stderr (stdout keeps the table or the JSON alone)."""
    partial = " (partial: an --op run never counts as the backend's conformance)" if ops else ""
    print(f"recorded as ledger run {run_id}{partial}", file=sys.stderr)
