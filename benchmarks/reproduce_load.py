"""Honest runs reproduced beside N busy loops: reproduced/recorded against the rule's slowdown.

    .venv/bin/python benchmarks/reproduce_load.py [--levels 0,1,2,3] [--loads 0,1,2,4] [--repeats 1]
        [--quiet S] [--record-nice N]

Each level's run is recorded once (at whatever load the machine has: printed; --quiet S waits
up to S s for a quiet machine first, --record-nice -20 records ahead of the other work: the
hardest case, a fast honest record), packaged, then reproduced by `d500 reproduce`'s own
function with N processes spinning beside it. Per reproduction: the ratio reproduced/recorded
of each timed figure, what its LoadWatch measured over the timed part (others' cores, the
share of its runnable time its threads waited for a core, its own cores, usable cores; the
job's demand in cores), the slowdown the time rule estimated from them
(d500.competition.reproduce_time.slowdown), the slack in seconds a time in seconds needed to
hold (reproduced <= (RATIO x recorded + slack) x slowdown; SLACK_S is the rule's) and its
verdict. An honest run is falsely accused where the verdict is 'DISAGREES'; the same run's
time halved would be 'caught' (disagrees), 'inconclusive', or 'ACCEPTED' (the defect)."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D500 = [str(Path(sys.executable).with_name("d500"))]
SPIN = "while True: pass"


def _run(home: Path, *args: str) -> None:
    done = subprocess.run([*D500, *args], env={**os.environ, "D500_HOME": str(home)},
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"d500 {' '.join(args)} failed: {done.stderr[-2000:]}")


def record(level: int, tmp: Path) -> Path:
    """The package of one honest run at `level`, under d500's own rulebook."""
    from d500.competition.export import build
    from d500.paths import rulebook
    home = tmp / f"origin{level}"
    if level == 2:
        entry = ROOT / "submissions" / "sgd-momentum"
        _run(home, "train", "digits-mlp", "--submission", str(entry), "--backend", "torch",
             "--threads", "1", "--seed", "0")
    elif level == 3:
        from d500.distributed.launcher import launch_train
        entry = ROOT / "submissions" / "sync"
        report = launch_train(rulebook() / "3-distributed" / "digits-mlp.yaml", entry, 2,
                              extra=["--seed", "0"],
                              env={**os.environ, "D500_HOME": str(home)})
        if not report.runs:
            sys.exit(f"the level-3 run failed: {report.problem} {report.stderr[-2000:]}")
    elif level == 1:  # the rehearsal's flake: onnxruntime:basic's 16 us latency at 1 thread
        entry = tmp / "ort-basic"
        entry.mkdir()
        (entry / "submission.yaml").write_text(
            "name: onnxruntime:basic\nlevel: 1\ndescription: onnxruntime, basic optimization\n")
        _run(home, "net", "bench", "mlp-mnist", "--backends", "onnxruntime:basic", "--budget",
             "0.05", "--threads", "1")
    else:
        entry = ROOT / "submissions" / "torch-softmax"
        _run(home, "op", "bench", str(entry), "--case", "softmax-last-axis", "--backends",
             "torch", "--budget", "0.5", "--threads", "1")
    return build(entry, tmp / f"level{level}.tar.gz", home / "ledger.sqlite")


class Spinners:
    """N busy-loop processes, started on entry and killed on exit."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> Spinners:
        back = -os.nice(0)  # the busy loops at the default niceness, whatever --nice set here
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN],
                                       preexec_fn=lambda: os.nice(back) and None)
                      for _ in range(self.n)]
        time.sleep(1.0 if self.n else 0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def reproduce_once(package: Path, ledger: Path) -> dict:
    """One honest reproduction: its time checks and the load its LoadWatch recorded."""
    from d500.competition.package import Package
    from d500.competition.reproduce import reproduce
    from d500.ledger import Ledger
    [report] = reproduce(Package.open(package), runs=1, seed=0, ledger=ledger).runs
    if report.run_id is None:
        sys.exit(f"the reproduction did not run: {report.problem}")
    local = Ledger(ledger).get(report.run_id)
    details = local.get("details") or {}
    return {"report": report, "load": details.get("load_average") or {},
            "passes": list((details.get("load_by_pass") or {}).values())}


SECONDS = ("time_to_accuracy", "evaluation times")  # judged with an absolute slack
TIMED = ("time_to_accuracy", "evaluation times", "latency", "backward_latency", "throughput")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="0,1,2,3")
    p.add_argument("--loads", default="0,1,2,4")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--nice", type=int, default=0,
                   help="niceness for d500's runs (negative: ahead of the machine's other work, "
                        "so that a one-thread run holds a core; the busy loops keep 0)")
    p.add_argument("--quiet", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for a quiet machine before recording each level")
    p.add_argument("--record-nice", type=int, default=None, metavar="N",
                   help="record at niceness N (negative, as root: ahead of the machine's other "
                        "work, a record as fast as a quiet machine's; default: --nice)")
    args = p.parse_args()
    if args.record_nice is None:
        args.record_nice = args.nice
    if args.nice:
        os.nice(args.nice)
    os.environ.setdefault("CI", "1")
    from d500.competition.reproduce_time import (
        RATIO,
        SLACK_S,
        judged,
        slowdown,
        too_fast,
    )
    with tempfile.TemporaryDirectory(prefix="reproduce-load-") as folder:
        tmp = Path(folder)
        print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; uptime: "
              f"{os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
              f"{os.cpu_count()} cores")
        packages = {}
        for level in map(int, args.levels.split(",")):
            if args.quiet:  # the hardest case: an origin recorded quiet, reproduced loaded
                from d500.provenance import wait_for_quiet
                print(f"level {level}: others took {wait_for_quiet(args.quiet)} cores before "
                      "recording", flush=True)
            os.setpriority(os.PRIO_PROCESS, 0, args.record_nice)  # (its children inherit it)
            packages[level] = record(level, tmp)
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
            from d500.competition.package import Package
            [run] = [r for r in Package.open(packages[level]).runs() if r.rank in (None, 0)]
            was = run._json("details").get("load_average") or {}
            print(f"level {level} recorded: " + ", ".join(
                f"{k} {run.figures[k]:.4g}" for k in TIMED if k in run.figures)
                + f"; its LoadWatch: others {was.get('during')} of {was.get('usable_cores')}")
        print("level  N  1-min  check              ratio  others waited own  cores demand  "
              "slowdown needs_s verdict       halved")
        i, needs = 0, {}  # N -> the slack the honest times needed (reproduce_time.too_fast)
        for n in map(int, args.loads.split(",")):
            for level, package in packages.items():
                for _ in range(args.repeats):
                    i += 1
                    with Spinners(n):
                        found = reproduce_once(package, tmp / f"organiser{i}" / "l.sqlite")
                    rep, load = found["report"], found["load"]
                    demand = 1 if level in (1, 2) else 2  # ranks x threads; 0: host + judge
                    allowed = max(slowdown(r, demand) for r in [load, *found["passes"]])
                    own = (load["own_cpu"] / load["wall"] if load.get("wall") else None)
                    for c in rep.checks:
                        if c.name not in TIMED:
                            continue
                        ratio = (c.recorded / c.reproduced if c.name == "throughput"
                                 else c.reproduced / c.recorded)
                        verdict = ("inconclusive" if c.inconclusive else
                                   "agrees" if c.agrees else "DISAGREES")
                        halved = (too_fast(c.recorded / 2, c.reproduced, allowed)
                                  if c.name in SECONDS else 2 * ratio > RATIO * allowed)
                        caught = ("caught" if halved else "ACCEPTED" if judged(allowed)
                                  else "inconclusive")
                        # reproduced <= (RATIO x recorded + slack) x slowdown holds from
                        # this slack on: the quiet machine's seconds of noise, slowed too
                        over = (c.reproduced / allowed - RATIO * c.recorded
                                if c.name in SECONDS and math.isfinite(allowed) else math.nan)
                        if math.isfinite(over):
                            needs.setdefault(n, []).append(over)
                        print(f"{level:>5} {n:>2} {os.getloadavg()[0]:6.2f}  {c.name:<17} "
                              f"{ratio:6.2f}  {load.get('during')!s:>6} "
                              f"{load.get('waited')!s:>6} "
                              f"{'-' if own is None else f'{own:.2f}':>4} "
                              f"{load.get('usable_cores')!s:>5} {demand:>6}  "
                              f"{allowed:8.2f} {over:8.3f} "
                              f"{verdict:<13} {caught}", flush=True)
        for n, found in needs.items():
            print(f"beside {n} busy loop(s): {len(found)} honest times to accuracy and "
                  f"evaluation times needed a slack of at most {max(found):.3f} s (median "
                  f"{statistics.median(found):.3f} s; SLACK_S {SLACK_S:g} s) in reproduced <= "
                  f"({RATIO:g} x recorded + slack) x slowdown")


if __name__ == "__main__":
    main()
