"""What level 3's cover of $D500_HOME (d500.distributed.cover) adds to a rank's start, before
the clock: the helper forked and the rank's own mount namespace (`cover.start`, before it
confines itself), then the cover mounted by the helper (`cover.cover`, before the entry's code),
against the step every rank already took (d500.children._code_read_only: d500's code read-only),
each in a fresh process (a rank's first steps), interleaved, as root. Prints each step's median
of N in ms and the two new steps' sum as a ratio of the old one.

    .venv/bin/python benchmarks/rank_cover.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STEP = r"""
import json, os, sys, time
from d500 import children
from d500.distributed import cover
t0 = time.perf_counter()
children._code_read_only()
t1 = time.perf_counter()
assert cover.start(sys.argv[1]) is not None, "no namespace permitted here (root's)"
t2 = time.perf_counter()
assert cover.cover(), "not covered"
t3 = time.perf_counter()
assert not os.path.exists(os.path.join(os.environ["D500_HOME"], "ledger.sqlite"))
print(json.dumps({"code_read_only": t1 - t0, "start": t2 - t1, "cover": t3 - t2}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    found: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home, entry = os.path.join(tmp, "home"), os.path.join(tmp, "entry")
        os.makedirs(os.path.join(home, "cache"))
        os.makedirs(entry)
        open(os.path.join(home, "ledger.sqlite"), "w").close()
        env = {**os.environ, "D500_HOME": home}
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", STEP, entry], env=env, check=True,
                                 capture_output=True, text=True)
            for k, v in json.loads(out.stdout.splitlines()[-1]).items():
                found.setdefault(k, []).append(v * 1e3)
    med = {k: statistics.median(v) for k, v in found.items()}
    for k, v in med.items():
        print(f"{k:15s} median {v:7.2f} ms  (min {min(found[k]):.2f}, max {max(found[k]):.2f}, "
              f"n={len(found[k])})")
    print(f"start + cover = {med['start'] + med['cover']:.2f} ms, "
          f"{(med['start'] + med['cover']) / med['code_read_only']:.1f}x code_read_only; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
