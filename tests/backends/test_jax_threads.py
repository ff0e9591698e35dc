"""--threads reaches JAX: XLA's CPU pool has the count's threads (read back from the process's own
threads), the environment is left as it was, an operator host's JAX gets the judge's count, and JAX
already running with another count is one clear error. Each case runs in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "D500_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("NPROC", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=ROOT, env=env)


@pytest.mark.parametrize("count", [1, 3])
def test_the_count_is_the_pool_xla_computes_with(count, tmp_path):
    out = python(f"""
        import json, os
        from d500 import builders, threads
        threads.configure({count}, threads.frameworks(["jax"]))
        from d500.backends.jax import JaxBackend
        import numpy as np
        exe = JaxBackend.prepare(builders.build("mlp", (1, 8, 8)))
        exe.run([np.ones((1, 1, 8, 8), np.float32)])
        tasks = {{t: open(f"/proc/self/task/{{t}}/comm").read().strip()
                 for t in os.listdir("/proc/self/task")}}
        import jax
        print(json.dumps({{"pool": sum("XLAEigen" in n for n in tasks.values()),
                          "actual": threads.actual()["jax"], "recorded": threads.recorded(),
                          "env": os.environ.get("NPROC"),
                          "async": jax.config.read("jax_cpu_enable_async_dispatch"),
                          "cores": len(os.sched_getaffinity(0)),
                          "thread_cores": sorted({{len(os.sched_getaffinity(int(t)))
                                                  for t in tasks}})}}))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["pool"] == found["actual"] == count
    assert found["recorded"] == {"count": count, "set_by": "--threads"}
    assert found["env"] is None  # child processes still choose their own
    # each computation on the caller's thread; XLA's pools, sized on the count's cores
    # (d500.threads.few_cores), back on every core, as the caller
    assert found["async"] is False
    assert found["thread_cores"] == [len(os.sched_getaffinity(0))], found


def test_jax_already_computing_cannot_change_its_count(tmp_path):
    out = python("""
        import jax.numpy as jnp
        (jnp.ones(3) + 1).block_until_ready()  # XLA's client starts with its own pool
        from d500 import threads
        from d500.errors import UsageError
        threads.configure(None, ["jax"])  # its own default is the default count
        try:
            threads.configure(3, ["jax"])
        except UsageError as err:
            print(err)
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(
        "XLA threads in this process and cannot change to 3: the thread count must be set "
        "before JAX computes anything (give --threads to a new d500 process)")


def test_an_operator_host_runs_jax_with_the_judges_count(tmp_path):
    out = python("""
        import json
        from d500 import threads
        from d500.operators.base import load
        threads.configure(1, [])
        loaded = load("submissions/jax-layernorm", isolated=True)
        run = loaded.cls(axis=-1).runner()
        import numpy as np
        run.forward([np.ones((4, 8), np.float32), np.ones(8, np.float32)])
        print(json.dumps(loaded.cls.host.ask("threads")))
        loaded.cls.close()
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["jax"] == 1
