"""Framework knowledge lives with the framework: every registered framework's folder defines its
FRAMEWORK (d500.backends.hooks), importing that folder imports no framework, and a framework
added from outside d500 (one module plus one entry point, in a tmp folder) reaches `d500
backends`, provenance, threads and the level-1 check without any table in d500 being edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import import_module
from pathlib import Path

import pytest

from d500 import backends
from d500.backends.hooks import Framework
from tests.helpers import install_plugin

ROOT = Path(__file__).resolve().parents[2]
REGISTERED = list(backends.BUILTIN)

# The third-party framework: its one module (what d500 knows about it, its thread hooks, its
# backend class, here the reference evaluator under another name, with a mode) ...
PLUGIN = '''
"""tinyfw: a framework d500 has never heard of."""
from d500.backends.hooks import Framework
from d500.backends.reference import ReferenceBackend

POOL = {"threads": None}


class Tiny(Framework):
    def set_threads(self, n):
        POOL["threads"] = n

    def threads(self):
        return POOL["threads"]


FRAMEWORK = Tiny("tiny", module="tinyfw", distribution="tinyfw", tie_rank=-1,
                 optimizer_ops="d500.backends.reference.optimizer_ops")


class TinyBackend(ReferenceBackend):
    name = "tiny"
    about = "the reference evaluator under another name"
    modes = {"fast": "the same, faster in name only"}
'''
# ... and its one registration line, an entry point of its installed distribution.
@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    install_plugin(tmp_path, "tinyfw", PLUGIN, {"tiny": "TinyBackend"}, version="1.2.3")
    return tmp_path


def run(code: str, path: Path, *args: str) -> subprocess.CompletedProcess:
    """Python (or, with args, the d500 command) in a new process that finds the plugin."""
    env = {**os.environ, "PYTHONPATH": str(path), "D500_HOME": str(path / "home"),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-m", "d500.cli", *args] if args else [
        sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                          cwd=ROOT, env=env)


@pytest.mark.parametrize("name", REGISTERED)
def test_every_registered_framework_defines_its_framework_in_its_folder(name):
    module = import_module(backends.BUILTIN[name].partition(":")[0])
    fw = backends.about(name)
    assert fw is module.FRAMEWORK and fw.name == name
    assert backends.framework(name) == (fw.module, fw.distribution)
    cls = backends.get(name)  # its class's modes are its FRAMEWORK's (`d500 backends` reads those)
    assert (cls.about, cls.modes) == (fw.about, fw.modes) and fw.about


@pytest.mark.parametrize("name", REGISTERED)
def test_a_framework_trains_exactly_when_it_has_optimizer_ops(name):
    fw = backends.about(name)
    assert backends.get(name).trainable == (fw.optimizer_ops is not None)
    assert (name in backends.trainable()) == (fw.optimizer_ops is not None)
    for ref in (fw.native_optimizers, fw.backward, fw.operator_runner):
        assert ref is None or fw.hook(ref) is not None  # every hook names what exists


def test_importing_a_framework_folder_imports_no_framework(tmp_path):
    out = run("""
        import sys
        from d500 import backends, provenance, threads
        for name in backends.BUILTIN:
            backends.about(name)
        provenance.versions()
        threads.frameworks(["torch", "tensorflow", "jax", "openvino", "onnxruntime"])
        print([m for m in ("torch", "tensorflow", "jax", "onnxruntime", "openvino")
               if m in sys.modules])
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_d500_backends_lists_a_third_party_framework_and_its_modes(plugin):
    out = run("", plugin, "backends")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert " 1.2.3 " in lines["tiny"] and "another name" in lines["tiny"]  # its version
    assert "faster in name only" in lines["tiny:fast"]
    assert "torch" in lines  # beside the built-in ones


def test_a_third_party_framework_gets_provenance_threads_and_the_level1_check(plugin):
    out = run("""
        import json
        import numpy as np
        from d500 import backends, provenance, threads
        from d500.builders import build
        from d500.networks.check import check
        import tinyfw

        found = {"framework": backends.framework("tiny:fast"),
                 "version": backends.get("tiny").version(),
                 "recorded": provenance.versions().get("tinyfw"),
                 "summary": "tinyfw 1.2.3" in provenance.summary({"packages":
                                                                 provenance.versions()}),
                 "trainable": "tiny" in backends.trainable()}
        threads.configure(1, threads.frameworks(["tiny:fast"]))
        found["threads"] = [tinyfw.POOL["threads"], threads.actual().get("tiny")]
        model = build("mlp")
        x = np.random.default_rng(0).normal(size=(2, 1, 28, 28)).astype(np.float32)
        name = model.graph.input[0].name
        report = check(model, {name: x}, ["tiny", "tiny:fast"])
        found["verdicts"] = {r.backend: r.verdict for r in report.checked}
        found["baseline"] = report.baseline
        print(json.dumps(found))
    """, plugin)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["framework"] == ["tinyfw", "tinyfw"]
    assert found["version"] == found["recorded"] == "1.2.3" and found["summary"]
    assert found["trainable"] and found["threads"] == [1, 1]
    assert found["verdicts"] == {"tiny": "agrees", "tiny:fast": "agrees"}
    assert found["baseline"] == "reference"


def test_a_backend_class_without_a_framework_object_is_described_by_its_class():
    class Bare:
        name = "bare:mode"
        framework = "numpy"

    fw = Framework.of_backend(Bare)
    assert (fw.name, fw.module, fw.distribution) == ("bare", "numpy", "numpy")
    Bare.framework = "?"
    assert Framework.of_backend(Bare).module == __name__


def test_native_optimizer_checkpoints_follow_the_framework_hook():
    from d500.errors import ConfigError
    from d500.training import checkpoint
    for name in backends.modes():
        fw = backends.about(name)
        if fw.native_checkpoints:
            checkpoint.supported(name, native=True)  # torch and its modes
        else:
            with pytest.raises(ConfigError, match=rf"on '{name}' is not read by d500 \(only on "
                                                  rf"torch\)"):
                checkpoint.supported(name, native=True)
        checkpoint.supported(name, native=False)
