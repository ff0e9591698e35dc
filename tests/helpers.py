"""Helpers shared by tests in several folders: the tiny level-1 workload (d500's MLP builder on
1x8x8 inputs) that the benchmark, summary, conformance and leaderboard tests measure; this
machine's peak FLOP/s, measured once per session, and onnx's node tests, built once, for the
fresh D500_HOMEs of d500 processes; a model of an operator no backend has; a backend plug-in
installed for a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

# every figure `d500 net bench` measures on a trainable model
BENCH_METRICS = ("train_step_time", "latency", "throughput", "translate_time", "first_call_time",
                 "agreement")


def tiny_mlp(name: str = "tiny-mlp", *, train: bool = False,
             metrics: Sequence[str] = ("latency", "throughput"), rank_by: str = "latency",
             batch_size: int = 16, budget: float = 0.05) -> str:
    """The text of a level-1 workload file: d500's MLP on 1x8x8 inputs at `batch_size`, each
    figure timed for `budget` seconds, `train` adding the training step."""
    return (f"name: {name}\nlevel: 1\nmodel:\n  builder: mlp\n  input_shape: [1, 8, 8]\n"
            f"batch_size: {batch_size}\ntrain: {'true' if train else 'false'}\n"
            f"budget: {budget:g}\nmetrics: [{', '.join(metrics)}]\nrank_by: {rank_by}\n")



# the cache file's name -> its text, measured by a child process: by the controller before any
# test started (tests/conftest.py: the xdist workers then busy the cores, and a peak measured
# beside them came out low enough that a quiet operator ran at 125 % of it), else on first use
_PEAK: dict[str, str] = json.loads(os.environ.get("D500_TEST_PEAK") or "{}")


def measure_peak() -> dict[str, str]:
    """This machine's peak FLOP/s cache file ({name: text}), measured in a child process with a
    fresh home (never under a test's monkeypatches)."""
    with tempfile.TemporaryDirectory() as fresh:
        env = {**os.environ, "D500_HOME": fresh}
        subprocess.run([sys.executable, "-c", "from d500 import provenance\n"
                        "provenance.peak_record()"], env=env, check=True, timeout=300)
        [path] = (Path(fresh) / "cache" / "provenance").glob("peak_flops-*.json")
        return {path.name: path.read_text()}


def seed_peak(home: Path | None) -> None:
    """Give a D500_HOME that has no cache yet this machine's cached peak FLOP/s, as a second run
    on it would find it: measured once per test session, in a child process with its own fresh
    home (never under a test's monkeypatches), and again when d500 would take it as stale (a
    peak measured on a loaded machine is retried after provenance.LOADED_RETRY). Each d500
    process on a fresh home measures it otherwise (float32 GEMMs on every core: 1.5-2 s on the
    2-core machine). tests/test_provenance.py tests the measuring and the caching themselves."""
    if home is None or (Path(home) / "cache").exists():
        return
    from d500 import provenance
    name, text = next(iter(_PEAK.items()), (None, None))
    if text is None or provenance._stale(json.loads(text), time.time()):
        _PEAK.clear()
        _PEAK.update(measure_peak())
        name, text = next(iter(_PEAK.items()))
    folder = Path(home) / "cache" / "provenance"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


# this session's D500_HOME (d500.paths.home), before any test moves it
AMBIENT_HOME = Path(os.environ.get("D500_HOME", "d500-results")).resolve()
_NODE_TESTS: list[Path] = []  # its cached node tests, once a child process made sure of them


def seed_node_tests(home: Path) -> None:
    """Give a fresh D500_HOME onnx's node tests as d500.conformance caches them, copied from
    the session's own D500_HOME (a child process reads them there once, or builds them when
    that home has none, as the node suite's collection does): each fresh home built them again
    otherwise (14 s of CPU; a copy takes milliseconds). tests/test_conformance.py tests the
    building and the caching themselves, in homes of their own."""
    import shutil
    if not _NODE_TESTS:
        subprocess.run([sys.executable, "-c", "from d500.conformance import node_tests\n"
                        "node_tests()"], env={**os.environ, "D500_HOME": str(AMBIENT_HOME)},
                       check=True, timeout=600, capture_output=True)
        _NODE_TESTS.extend((AMBIENT_HOME / "cache" / "onnx").glob("*.pickle"))
    folder = Path(home) / "cache" / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    for shared in _NODE_TESTS:
        if not (folder / shared.name).exists():
            partial = folder / f"{shared.name}.{os.getpid()}.tmp"
            shutil.copyfile(shared, partial)
            partial.replace(folder / shared.name)


# A process of an entry's as `on_host` finds it: its PID namespace and its pid there, the
# expression an entry's code (which imports os) writes. In the namespace of an entry's process,
# with a /proc of its own (d500.children._own_proc), /proc/self is not the host's pid: the
# host's process of that number is another's.
ME = "os.readlink('/proc/self/ns/pid') + ' ' + os.readlink('/proc/self')"


def me() -> str:
    """This process as ME names it."""
    return os.readlink("/proc/self/ns/pid") + " " + os.readlink("/proc/self")


def on_host(named: str) -> int | None:
    """The host's pid of the process ME named, None where it has ended: the one in that PID
    namespace whose innermost pid (NSpid's last) is that."""
    ns, pid = named.split()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{name}/status").read_text().splitlines()
        except OSError:
            continue
        if next((line.split()[-1] for line in status if line.startswith("NSpid:")), "") == pid:
            return int(name)
    return None


def custom_op_model(ir_version: int | None = None) -> onnx.ModelProto:
    """A model of one node, 'act1', of an operator no backend has: com.example::FancyGelu at
    opset 3 (`ir_version` set for a runtime that reads no newer)."""
    from onnx import TensorProto, helper
    node = helper.make_node("FancyGelu", ["x"], ["y"], domain="com.example", name="act1")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 3)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def install_plugin(folder: Path, module: str, source: str, backends: dict[str, str],
                   version: str = "0.1") -> dict[str, str]:
    """`source` installed in `folder` as the distribution `module` at `version`: the module and
    a dist-info whose d500.backends entry points map each of `backends` (backend name -> class
    in the module). The environment of a d500 process that finds it (PYTHONPATH `folder`,
    D500_HOME under it)."""
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "[d500.backends]\n" + "".join(f"{name} = {module}:{cls}\n"
                                      for name, cls in backends.items()))
    return {**os.environ, "PYTHONPATH": str(folder), "D500_HOME": str(folder / "home")}
