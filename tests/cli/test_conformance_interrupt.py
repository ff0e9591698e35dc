"""^C (a terminal's SIGINT, to the whole process group) during `d500 conformance --jobs N`
ends it at once with its one line: the pool's workers took it too, handed it back as the
chunk's result and ran on into the chunks queued (the reference suite: 17-30 s more), and a
worker interrupted while importing torch imported it again and aborted in C++."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.helpers import seed_node_tests
from tests.training.test_startup_interrupt import D500, _child


def test_ctrl_c_ends_a_conformance_run_in_workers_at_once(tmp_path):
    home = tmp_path / "home"
    seed_node_tests(home)
    env = {**os.environ, "D500_HOME": str(home)}
    job = subprocess.Popen([sys.executable, "-c", D500, "conformance", "--backend", "reference",
                            "--jobs", "2"], env=env, cwd=tmp_path, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _child(job.pid, b"spawn_main") is None and job.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.poll() is None, job.communicate()
        time.sleep(3)  # the workers import the backend and run their first chunks
        os.killpg(job.pid, signal.SIGINT)
        start = time.monotonic()
        out, err = job.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 130, err
    assert err.strip().splitlines() == ["d500 conformance: interrupted"], err
    assert took < 10, f"^C took {took:.1f} s to end it"
