"""A backend is a framework and a mode (issue 18): `d500.backends.get("onnxruntime:basic")`,
`d500 backends` listing every mode, an unknown mode as one line and exit 2, and a bench over
two modes of one framework recorded as two runs under their full names, two rows on the
level-1 board."""

from __future__ import annotations

import json

import pytest

from d500 import backends, leaderboard, threads
from d500.backends.cli import main as list_backends
from d500.ledger import Ledger
from d500.networks import workloads
from d500.networks.bench import bench
from tests.helpers import tiny_mlp

from .conftest import d500

MODES = ["onnxruntime", "onnxruntime:basic"]


def test_a_mode_is_a_backend_class_of_its_framework():
    base, basic = backends.get("onnxruntime"), backends.get("onnxruntime:basic")
    assert basic is backends.get("onnxruntime:basic") and issubclass(basic, base)
    assert (base.name, base.mode, basic.name, basic.mode) == (
        "onnxruntime", "", "onnxruntime:basic", "basic")
    assert basic.framework == base.framework == "onnxruntime"
    assert basic.version() == base.version() and basic.default_mode() is base
    assert backends.split("onnxruntime:basic") == ("onnxruntime", "basic")
    assert backends.framework("onnxruntime:basic") == ("onnxruntime", "onnxruntime")
    assert threads.frameworks(MODES) == ["onnxruntime"]
    assert set(base.mode_names()) == set(MODES) and all(base.mode_names().values())
    assert backends.installed().count("onnxruntime") == 1  # a default run: the default mode


def test_d500_backends_lists_every_mode_with_what_it_is(capsys):
    assert list_backends([], "d500 backends") == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for name in ("reference", "torch", "tensorflow", *MODES):
        assert name in lines and backends.version(name) in lines[name]
    assert "ORT_ENABLE_BASIC" in lines["onnxruntime:basic"]
    assert "ORT_ENABLE_ALL" in lines["onnxruntime"] and "eager" in lines["torch"]
    assert "jit_compile=True" in lines["tensorflow:xla"] and "graph" in lines["tensorflow"]
    if backends.is_installed("openvino"):
        assert "f32" in lines["openvino"] and "bf16" in lines["openvino:bf16"]


def test_d500_backends_imports_no_framework():
    """The list comes from each framework's FRAMEWORK (its modes, their lines) and the
    distributions' metadata (versions): importing torch alone took 7-40 s here."""
    import subprocess
    import sys
    code = ("import sys; from d500.backends.cli import main; main([], 'd500 backends'); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'jax', 'onnxruntime', 'openvino') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[-1] == "[]"
    lines = {line.split()[0]: line.split()[1] for line in out[:-1]}
    assert lines["torch:compiled"] == lines["torch"] == backends.get("torch").version()
    assert lines["onnxruntime:basic"] == backends.get("onnxruntime").version()


@pytest.mark.parametrize("args", [
    ["net", "bench", "mlp-mnist", "--backends", "onnxruntime,onnxruntime:fast"],
    ["net", "check", "model.onnx", "--backends", "onnxruntime:fast"],
    ["conformance", "--backend", "onnxruntime:fast"],
])
def test_an_unknown_mode_is_one_line_and_exit_2(home, args):
    result = d500(*args, home=home)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert ("unknown backend mode 'onnxruntime:fast' (the modes of onnxruntime: onnxruntime, "
            "onnxruntime:basic)") in result.stderr
    assert not (home / "ledger.sqlite").exists()  # nothing ran


def test_a_bench_over_two_modes_records_two_runs_and_two_board_rows(tmp_path, home):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_mlp(metrics=["latency", "agreement"], batch_size=2, budget=0.05))
    result = bench(workloads.load(path), MODES)
    assert result.exit_code == 0, [r.error for r in result.results]
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="tiny-mlp")}
    assert set(runs) == set(MODES)
    for name, run in runs.items():
        assert run["status"] == "succeeded" and run["submission"] == name
        assert run["figures"]["latency"] > 0 and run["figures"]["agreement"] < 1e-5
    levels = {n: runs[n]["details"]["settings"]["graph_optimization_level"] for n in MODES}
    assert levels == {"onnxruntime": "ORT_ENABLE_ALL", "onnxruntime:basic": "ORT_ENABLE_BASIC"}
    text = leaderboard.render(level=1, workload="tiny-mlp", fmt="md")
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | " in line
            and line.split("|")[1].strip().isdigit()]
    assert len(rows) == 2, text
    assert sorted(r.split("|")[2].strip() for r in rows) == MODES  # never pooled into one row


def test_the_cli_bench_records_each_mode(tmp_path, home):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_mlp(metrics=["latency"], batch_size=2, budget=0.02))
    result = d500("net", "bench", path, "--backends", ",".join(MODES), "--threads", "1",
                  "--json", home=home)
    assert result.returncode == 0, result.stderr
    assert [r["backend"] for r in json.loads(result.stdout)] == MODES
    listed = json.loads(d500("ledger", "list", "--level", "1", "--json", home=home).stdout)
    assert sorted(r["backend"] for r in listed) == MODES


def test_openvino_bf16_is_judged_at_bfloat16_tolerance_in_a_bench(tmp_path, home):
    pytest.importorskip("openvino")
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_mlp(metrics=["latency", "agreement"], batch_size=2, budget=0.02))
    result = bench(workloads.load(path), ["openvino", "openvino:bf16"])
    assert result.exit_code == 0, [r.error for r in result.results]
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="tiny-mlp")}
    tolerance = {n: {c["rtol"] for c in run["details"]["agreement"]} for n, run in runs.items()}
    assert tolerance == {"openvino": {1e-3}, "openvino:bf16": {2e-2}}
    settings = {n: run["details"]["settings"] for n, run in runs.items()}
    assert settings["openvino"]["inference_precision"] == "f32"
    assert settings["openvino:bf16"]["requested_precision"] == "bf16"
    assert settings["openvino:bf16"]["inference_precision"] in ("bf16", "f32")  # f32: no bf16 units


def test_a_mistyped_backend_names_the_closest_mode():
    from d500.errors import UsageError
    for typo, near in (("torc", "torch"), ("tensorfow", "tensorflow"),
                       ("onnxruntime-basic", "onnxruntime:basic")):
        with pytest.raises(UsageError, match=rf"unknown backend '{typo}' .*did you mean "
                                             rf"'{near}'\?\)$"):
            backends.get(typo)
        with pytest.raises(UsageError, match="did you mean"):
            backends.select(f"reference,{typo}")
    with pytest.raises(UsageError, match=r"unknown backend mode 'onnxruntime:basci' \(the modes "
                                         r"of onnxruntime: .*; did you mean 'onnxruntime:basic'"):
        backends.get("onnxruntime:basci")  # a known framework, a mistyped mode
    with pytest.raises(UsageError) as err:
        backends.get("xyz")
    assert "did you mean" not in str(err.value) and "their modes: d500 backends" in str(err.value)
