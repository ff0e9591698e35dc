"""Which threads of honest level-3 ranks were runnable while rank 0's judge measured them.

d500.training.cpu fails a run whose threads were runnable more than its bound allows; at level 3
the judge reads every rank on rank 0's host. This runs a real 'mpiexec -n 2 d500 train
digits-mlp --seeds 1 --threads 1' (the entry given; `--burn N`: N CPU-bound processes beside it)
with a sitecustomize that, as the judge checks, writes each live thread's run and wait between
the judge's two readings, and prints them by thread name (/proc/TID/comm), the highest first,
and each rank's runnable ratio with every wait counted whole and as the judge now counts it
(cpu.counted: a sleeper's up to the wait per second run that all had), and the machine's load.

    .venv/bin/python benchmarks/rank_threads.py --entry ddp-baseline --burn 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from d500.training import cpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.distributed import level3_jobs as jobs  # noqa: E402

HOOK = '''
import os
if os.environ.get("RANK_THREADS_DUMP"):
    import d500.training.cpu as cpu
    checked = cpu.Meter.check
    def check(self, run):
        end = self.worker.cpu_seconds() if self.start is not None else None
        rows = []
        for tid, now in (end[1] if end and self.start else {}).items():
            try:
                comm = open(f"/proc/{tid}/comm").read().strip()
                pid = [x.split()[1] for x in open(f"/proc/{tid}/status") if x.startswith("Tgid")][0]
            except (OSError, IndexError):
                comm, pid = "?", "?"
            rows.append([pid, tid, comm, self.start[1].get(tid), now])
        with open(os.environ["RANK_THREADS_DUMP"], "w") as f:
            json.dump({"worked": self.worked, "threads": rows}, f)
        return checked(self, run)
    import json
    cpu.Meter.check = check
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entry", default="ddp-baseline")
    ap.add_argument("--burn", type=int, default=0, help="CPU-bound processes beside the job")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.burn)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            (tmp_path / "hook").mkdir()
            (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
            mlp = jobs.workload(tmp_path, "digits-mlp", target={"value": 0.9})
            data = yaml.safe_load(mlp.read_text())
            data.pop("reference_convergence", None)
            mlp.write_text(yaml.safe_dump(data))
            env = jobs.environment(tmp_path / "home")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(tmp_path / "hook"),
                                                               env.get("PYTHONPATH"))))
            env["RANK_THREADS_DUMP"] = str(tmp_path / "threads.json")
            load = os.getloadavg()[0]
            out = jobs.train(tmp_path / "home", 2, mlp, jobs.ENTRIES / args.entry, "--seeds", "1",
                             "--threads", "1", env=env)
            print(f"{args.entry}, {args.burn} burner(s), load {load:.1f} to "
                  f"{os.getloadavg()[0]:.1f}: exit {out.returncode}")
            if out.returncode:
                print(out.stderr.strip().splitlines()[-1])
            dump = json.loads((tmp_path / "threads.json").read_text())
    finally:
        for b in burners:
            b.kill()
    worked, rows = dump["worked"], dump["threads"]
    print(f"worked {worked:.3f} s; per thread since the clock started: runnable (ran + waited), "
          "and a time on a CPU: its mean run, woken (voluntary switches), taken off (not)")
    zero = (0.0, 0.0, 0, 0, 0)
    delta = [(pid, tid, comm, [b - a for a, b in zip(was or zero, now)])
             for pid, tid, comm, was, now in rows]
    for pid, tid, comm, d in sorted(delta, key=lambda x: -(x[3][0] + x[3][1])):
        if d[0] + d[1] >= 0.001:
            print(f"  pid {pid:>7} {comm:<16} runnable {d[0] + d[1]:6.3f} ran {d[0]:6.3f} waited "
                  f"{d[1]:6.3f}; {d[2]:>5} times on a CPU, {1e6 * d[0] / max(d[2], 1):7.1f} us "
                  f"each, woken {d[3]:>5}, taken off {d[4]:>5}")
    for pid in sorted({x[0] for x in rows}):
        start = (0.0, {tid: was or zero for p, tid, _, was, _ in rows if p == pid})
        end = (0.0, {tid: now for p, tid, _, _, now in rows if p == pid})
        ran, waited = cpu.live(start, end)
        if ran < 0.01:
            continue
        kept = cpu.counted(start, end, waited / ran)
        print(f"process {pid}: every wait counted {(ran + waited) / worked:.2f}x, sleepers' "
              f"up to the wait per s run ({waited / ran:.2f}) {(ran + kept) / worked:.2f}x per "
              "recorded thread")

if __name__ == "__main__":
    main()
