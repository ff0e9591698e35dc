"""Where the judge/entry split's time goes, chunk by chunk: the worker's pipe messages timed in
both processes, against the in-process loop, for several placements of judge and worker.

benchmarks/isolation.py gives the split's cost; this splits a chunk's extra time (as the judge
times a chunk of training) into: `out`, from the judge's sending a chunk to the worker's
receiving it; `own`, the worker's chunk from that receipt to its sending the model back; `back`,
from that sending to the judge's receipt. The pipe messages are timed by a hook
(benchmarks/_hook/sitecustomize.py, on PYTHONPATH of a fresh process per run, inherited by its
worker), so d500's own code runs unchanged. Placements: `worker` (as d500 runs it: the judge
spins a bounded while around the time a chunk is due, d500.training.waiting; the worker
blocks for the answer since its spin starved the judge's ledger commit, README),
`early-4ms` (so, but the judge looks from 4 ms before a chunk is due, not 1 ms), `blocking`
(both sides block in every pipe read, as d500 ran before that), `pinned`
(judge on CPU 0, worker on CPU 1), `one-cpu` (both on CPU 1), `poll-1ms` (both sides
busy-poll 1 ms before a pipe read blocks), `never-sleep` (both busy-poll 50 ms, longer than a
digits-mlp chunk). Same seed per round, the order rotated; digits-mlp, torch at 1 thread.

    .venv/bin/python benchmarks/isolation_trace.py [--pairs 10] [--realtime]
        [--placements worker,early-4ms,blocking,pinned,one-cpu,poll-1ms,never-sleep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLACEMENTS = {"worker": (None, None, 0.0), "early-4ms": (None, None, 0.0),
              "blocking": (None, None, 0.0), "pinned": ({0}, {1}, 0.0),
              "one-cpu": ({1}, {1}, 0.0), "poll-1ms": (None, None, 0.001),
              "never-sleep": (None, None, 0.05)}  # judge's CPUs, worker's CPUs, busy-poll s


def fresh(placement: str, seed: int, realtime: bool) -> dict[str, Any]:
    """In a fresh process (started by `one`): one digits-mlp run, its figures."""
    os.environ["D500_HOME"] = tempfile.mkdtemp(prefix="d500-isolation-trace-")
    sys.path.insert(0, str(HERE))
    import isolation

    from d500 import threads
    from d500.training import submission, waiting, worker
    threads.configure(1, ["torch"])
    recipe = submission.load(isolation.ROOT / "submissions" / "sgd-momentum").recipe
    judge_cpus, worker_cpus, _ = PLACEMENTS.get(placement, (None, None, 0.0))
    if judge_cpus:
        os.sched_setaffinity(0, judge_cpus)
    start = worker.Worker._start

    def placed(self: Any, ctx: Any) -> None:
        if placement == "early-4ms":  # the judge looks from 4 ms before a chunk is due
            waiting.EARLY = 0.004
        elif placement != "worker":  # d500's spin only as d500 runs it
            self.spin, self.job = 0.0, replace(self.job, spin=0.0)
        start(self, ctx)
        if worker_cpus:  # (the keeper's, inherited by the worker, or the worker's)
            from d500 import children
            os.sched_setaffinity(children.kept(self.process.pid), worker_cpus)

    worker.Worker._start = placed
    try:
        got = isolation.run(isolation.case("mlp"), recipe, seed, placement == "in-process",
                            realtime)
    finally:
        shutil.rmtree(os.environ["D500_HOME"], ignore_errors=True)
    return {"chunks": got["chunks"], "counts": got["counts"], "judge": os.getpid(),
            "epochs": got["epochs"]}


def one(placement: str, seed: int, realtime: bool) -> dict[str, Any]:
    """One run in a fresh process with the hook; its chunks, timed from both sides."""
    trace = tempfile.mkdtemp(prefix="d500-trace-")
    env = {**os.environ, "PYTHONPATH": str(HERE / "_hook"), "D500_TRACE": trace,
           "D500_SPIN_S": str(PLACEMENTS.get(placement, (0, 0, 0.0))[2]),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import isolation_trace as t; "
            f"print(json.dumps(t.fresh({placement!r}, {seed}, {realtime})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr.strip().splitlines()[-1])
        got = json.loads(done.stdout.strip().splitlines()[-1])
        got["trace"] = split(trace, got["judge"])
    finally:
        shutil.rmtree(trace, ignore_errors=True)
    return got


def split(trace: str, judge: int) -> list[dict[str, float]]:
    """Each chunk's out, own and back (s) from the two processes' message times."""
    logs = {}
    for f in Path(trace).glob("*.tsv"):
        logs[int(f.stem)] = [(a, tag, float(t)) for a, tag, t in
                             (line.split("\t") for line in f.read_text().splitlines())]
    mine = logs.pop(judge, [])
    theirs = max(logs.values(), key=len, default=[])
    sent = [t for a, tag, t in mine if a == "send" and tag == "train"]
    got = [t for a, tag, t in theirs if a == "recv" and tag == "train"]
    back = [t for a, tag, t in theirs if a == "send" and tag == "trained"]
    reads = [t for a, _, t in mine if a == "recv"]
    arrived = [next((r for r in reads if r >= b), b) for b in back]
    return [{"out": g - s, "own": b - g, "back": r - b}
            for s, g, b, r in zip(sent, got, back, arrived)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    p.add_argument("--realtime", action="store_true",
                   help="both sides SCHED_FIFO over the timed part (root; see isolation.py)")
    args = p.parse_args()
    chosen = args.placements.split(",")
    unknown = [x for x in chosen if x not in PLACEMENTS]
    if unknown:
        sys.stderr.write(f"isolation_trace.py: no placement '{unknown[0]}' (there are "
                         f"{', '.join(PLACEMENTS)})\n")
        raise SystemExit(2)
    sys.path.insert(0, str(HERE))
    from isolation import _may_realtime
    if args.realtime and not _may_realtime():
        sys.stderr.write("isolation_trace.py: --realtime needs the right to set SCHED_FIFO "
                         "(root or CAP_SYS_NICE, on Linux); run without it\n")
        raise SystemExit(2)
    print(f"digits-mlp, torch at 1 thread, a fresh process per run"
          f"{', SCHED_FIFO over the timed part' if args.realtime else ''}, load average "
          f"{os.getloadavg()[0]:.2f} at start", flush=True)
    sides = ["in-process", *chosen]
    rows: dict[str, list[tuple[float, ...]]] = {x: [] for x in chosen}
    moved: dict[str, list[float]] = {x: [] for x in chosen}
    for i in range(args.pairs):
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        got = {x: one(x, 100 + i, args.realtime) for x in order}
        base = got["in-process"]["chunks"][1:]
        for x in chosen:
            run = got[x]
            if run["epochs"] != got["in-process"]["epochs"]:
                raise SystemExit(f"seed {100 + i}: {x} trained {run['epochs']} epochs, "
                                 f"in-process {got['in-process']['epochs']}: not the same run")
            for a, b, c in zip(base, run["chunks"][1:], run["trace"][1:]):
                rows[x].append((b - a, a, c["out"], c["own"] - a, c["back"]))
            moved[x].append(run["counts"].get("worker", {}).get("migrations", float("nan")))
        print(f"  round {i + 1} of {args.pairs} done, load average {os.getloadavg()[0]:.2f}",
              flush=True)
    print(f"a chunk after the first, against in-process (median of paired chunks, ms): "
          f"load average {os.getloadavg()[0]:.2f} at end")
    for x in chosen:
        if not rows[x]:
            continue
        added, base, out, own, back = (statistics.median(v) * 1e3 for v in zip(*rows[x]))
        print(f"  {x:<12} {added:+.3f} of {base:.2f} ({100 * added / base:+.1f} %): out "
              f"{out:.3f}, the worker's own chunk {own:+.3f}, back {back:.3f}; the worker's "
              f"migrations a run {statistics.median(moved[x]):g} ({len(rows[x])} chunks)",
              flush=True)


if __name__ == "__main__":
    main()
