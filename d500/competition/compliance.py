"""MLPerf's own compliance checker (mlperf_logging, Training 6.1.0) run on a d500 MLLOG, with only
the rules that cannot apply to d500 left out; `d500 check` and the level-2/3 tests run it alike.

    from d500.competition.compliance import problems
    problems(path, level=2, status="succeeded")   # [] when the checker accepts the log
    problems(path, level=2, attention=True)       # a language model: _in_attn required too

What is left out of MLPerf Training 6.1.0's common rules, and why:
- submission_division's POST enqueues closed_common.yaml, whose submission_benchmark must be one
  of MLPerf's own benchmarks (flux1, llama31_8b, ...): a d500 workload is none of them. The POST's
  other half (the 30-minute init limit of the closed division) is kept;
- lowest_numerical_precision_in_attn, except for a language model (`attention`: a workload over a
  text corpus, whose log has it): the other networks have no attention layers;
- lowest_numerical_precision_in_comm at level 2: a level-2 run is one process and communicates
  nothing (level 3 logs it, and is held to it);
- at levels 0 and 1 (a benchmark, not a training run), and for a run that diverged (it stops at
  the step whose loss was not finite, maybe before its first evaluation or epoch end), only the
  submission description and the init and run intervals apply; a run that ended failed,
  interrupted or timeout may have stopped anywhere, even before run_start, so only the
  submission description and init_start are required of its log. Succeeded and missed runs
  (a missed run always ends with an evaluation) are held to every rule.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

RULESET = "6.1.0"
TRAINED = ("succeeded", "missed")  # runs whose log holds a whole training run
STARTED = (*TRAINED, "diverged")  # runs whose log holds run_start and run_stop
DESCRIPTION = ("submission_org", "submission_platform", "submission_division", "init_start")
INTERVALS = (*DESCRIPTION, "init_stop", "run_start", "run_stop")
DIVISION_POST = " s['compile_time_mins'] = 240 if v['value'] == 'open' else 30 "


def available() -> bool:
    """Whether mlperf_logging is installed (it comes with d500's `test` extra)."""
    try:
        import mlperf_logging.compliance_checker  # noqa: F401
    except ImportError:
        return False
    return True


def rules(level: int, status: str = "succeeded", attention: bool = False
          ) -> list[dict[str, Any]]:
    """MLPerf Training 6.1.0's common rules as d500 applies them to a run of `level` that
    ended `status` (see the module docstring); `attention`: the run's network has attention."""
    import mlperf_logging.compliance_checker as cc
    import yaml
    common = Path(cc.__file__).parent / f"training_{RULESET}" / "common.yaml"
    dropped = set() if attention else {"lowest_numerical_precision_in_attn"}
    if level != 3:
        dropped.add("lowest_numerical_precision_in_comm")
    kept_keys: tuple[str, ...] | None = None  # None: every key
    if status not in STARTED:
        kept_keys = DESCRIPTION
    elif status not in TRAINED or level not in (2, 3):
        kept_keys = INTERVALS
    kept = []
    for rule in yaml.safe_load(common.read_text(encoding="utf-8")):
        key = rule.get("KEY")
        if key is not None:
            if key["NAME"] in dropped or (kept_keys is not None and key["NAME"] not in kept_keys):
                continue
            if key["NAME"] == "submission_division":
                key["POST"] = DIVISION_POST
        kept.append(rule)
    return kept


@cache
def rules_file(level: int, status: str = "succeeded", attention: bool = False) -> Path:
    """`rules(level, status, attention)` written once per process to a file the checker reads."""
    import yaml
    kind = {"succeeded": "trained", "diverged": "started"}.get(status, "stopped")
    folder = Path(tempfile.mkdtemp(prefix="d500-mlperf-rules-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # (it leaked one per process)
    path = folder / f"d500_training_{RULESET}_level{level}_{kind}{'_attn' * attention}.yaml"
    path.write_text(yaml.safe_dump(rules(level, status, attention)), encoding="utf-8")
    return path


def problems(path: str | Path, level: int = 2, status: str = "succeeded",
             attention: bool = False) -> list[str]:
    """What MLPerf's parser and compliance checker find wrong in the MLLOG at `path`, one line
    each (empty: accepted); a log they cannot read through (a record without `value`, metadata
    that is no mapping, ...) is one line saying what they failed on. `attention`: the run's
    workload is a language model, whose log must state attention's precision. Raises
    ImportError when mlperf_logging is not installed."""
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser
    rules_path = str(rules_file(level, _kind(status), attention))
    try:
        loglines, errors = mlp_parser.parse_file(str(path), ruleset=RULESET)
        found = [f"line not parsed ({why}): {line[:80]}" for line, why in errors]
        if not loglines:
            return [*found, "no :::MLLOG lines"]
        checker = mlp_compliance.make_checker("training", RULESET, quiet=True, werror=True)
        checker.configured_checks(loglines, rules_path)
        messages = [*checker.not_overwritable, *checker.overwritable.values()]
    except Exception as err:  # the parser and the rules' code read the sender's log unguarded
        return [f"MLPerf's parser and checker fail on it ({type(err).__name__}: "
                f"{str(err)[:120]}){_first_bad_line(path)}"]
    return found + [one_line(m) for m in messages]


def _first_bad_line(path: str | Path) -> str:
    """"; line N is not an MLLOG record (why)" for the log's first such line (d500.mllog's
    reading), else ""."""
    from d500 import mllog
    bad = mllog.parse_text(Path(path).read_text(encoding="utf-8", errors="replace"))[1]
    return f"; line {bad[0][0]} is not an MLLOG record ({bad[0][1]})" if bad else ""


def _kind(status: str) -> str:
    """The status rules_file is cached under: one per set of rules."""
    if status in TRAINED:
        return "succeeded"
    return "diverged" if status in STARTED else "failed"


def one_line(message: str) -> str:
    """A checker message (several lines: the check, the log line, the state) as one line: its
    first line and the test that failed."""
    lines = [s.strip() for s in message.splitlines() if s.strip()]
    if not lines:
        return "(empty message)"
    tests = [s for s in lines[1:] if s.startswith("failed test:")]
    return " ".join([lines[0], *tests])
