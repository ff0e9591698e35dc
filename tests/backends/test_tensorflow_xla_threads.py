"""tensorflow:xla compiles on the recorded threads: XLA's compile pool, sized by the first
jit_compile'd function at one thread per core the thread compiling it may use, is started on the
count's cores when a tensorflow:xla model is prepared (d500.backends.tensorflow.framework.
start_xla): a model's first run compiles on that pool and a thread driving it, no more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat")
                    or len(os.sched_getaffinity(0)) < 2,
                    reason="/proc's schedstat; more cores than the one recorded")
def test_xla_compiles_on_the_recorded_thread(tmp_path):
    code = textwrap.dedent("""
        import json, os, threading
        from d500 import backends, builders, threads
        threads.configure(1, threads.frameworks(["tensorflow"]))
        import numpy as np

        def ran():
            found = {}
            for t in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{t}/schedstat") as f:
                        found[t] = int(f.read().split()[0])
                except OSError:
                    pass
            return found

        exe = backends.get("tensorflow:xla").prepare(builders.build("mlp", (1, 8, 8)))
        before = ran()
        exe.run([np.ones((1, 1, 8, 8), np.float32)])  # compiles
        after, caller = ran(), str(threading.get_native_id())
        print(json.dumps({"others": sum(r > before.get(t, 0) for t, r in after.items()
                                        if t != caller),
                          "cores": sorted({len(os.sched_getaffinity(int(t))) for t in after})}))
    """)
    env = {**os.environ, "D500_HOME": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    # XLA's own start: its client's 15 threads and a compile pool of 2 ran beside the caller
    assert found["others"] <= 2, found  # the compile pool's 1 thread and the one driving it
    assert found["cores"] == [len(os.sched_getaffinity(0))], found  # every thread on all cores
