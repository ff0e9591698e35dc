"""torch:compiled: the ONNX graph as one static fx program that torch.compile compiles once.

One tiny model (MatMul, Add, Relu, Reshape) keeps the compiles few and small; Inductor's cache
under the test's D500_HOME serves the repeats.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch._dynamo
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from d500.backends import get
from d500.networks.compare import compare

pytestmark = pytest.mark.slow  # each first compile takes seconds (Inductor builds C++)


def tiny(shape_input: bool = False):
    """y = reshape(relu(x @ w + b), shape): the shape an initializer, or a graph input."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])]
    if shape_input:
        inputs.append(helper.make_tensor_value_info("shape", T.INT64, [2]))
    else:
        inits.append(numpy_helper.from_array(np.array([3, 4], np.int64), "shape"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    out = helper.make_tensor_value_info("y", T.FLOAT, ["p", "q"])
    graph = helper.make_graph(nodes, "tiny", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)


def test_one_graph_compiled_once_agrees_with_eager_and_never_recompiles(home):
    model = tiny()
    eager, compiled = get("torch").prepare(model), get("torch:compiled").prepare(model)
    torch._dynamo.utils.counters.clear()
    for seed in range(4):  # the same shape, other values: no recompile
        [got], [want] = compiled.run([x(seed)]), eager.run([x(seed)])
        assert got.shape == (3, 4)
        assert compare("y", got, want).ok
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["unique_graphs"] == 1 and stats["calls_captured"] > 0
    assert not torch._dynamo.utils.counters["recompiles"]
    assert compiled.compile_time > 0
    [(program, free, baked)] = compiled._compiled.programs.values()
    assert free == ["x"] and baked == []
    explained = torch._dynamo.explain(program._orig_mod)(torch.from_numpy(x(0)))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert (home / "cache" / "torch-inductor").is_dir()
    assert compiled.settings()["fullgraph"] is True


def test_a_long_program_runs_through_inductors_cpp_wrapper_and_agrees(home, monkeypatch):
    """A program of CPP_WRAPPER_FROM aten calls or more compiles Inductor's C++ wrapper (here the
    tiny one, the bar lowered): it agrees with eager, and its C++ entry is in the cache; a
    shorter program keeps the Python wrapper."""
    from d500.backends.torch import compiled as module
    model = tiny()
    eager, short = get("torch").prepare(model), get("torch:compiled").prepare(model)
    short.run([x(0)])
    assert short.settings()["wrapper"] == "Python"

    def entries() -> int:
        return sum("inductor_entry_impl" in p.read_text() for p in home.rglob("*.cpp"))
    assert entries() == 0
    monkeypatch.setattr(module, "CPP_WRAPPER_FROM", 1)
    long = get("torch:compiled").prepare(model)
    for seed in range(3):
        [got], [want] = long.run([x(seed)]), eager.run([x(seed)])
        assert compare("y", got, want).ok
    assert long.settings()["wrapper"] == "C++" and entries() >= 1

def test_an_input_that_decides_a_shape_is_baked_and_each_value_has_its_program(home):
    compiled = get("torch:compiled").prepare(tiny(shape_input=True))
    eager = get("torch").prepare(tiny(shape_input=True))
    for shape in ([3, 4], [12, 1], [3, 4], [2, 6]):
        feeds = [x(1), np.array(shape, np.int64)]
        [got], [want] = compiled.run(feeds), eager.run(feeds)
        assert got.shape == tuple(shape)  # a stale program would keep the first shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(compiled._compiled.programs) == 3 and compiled.baked_inputs == ["shape"]
    assert all(baked == ["shape"] for _, _, baked in compiled._compiled.programs.values())


def test_new_parameters_reach_the_frozen_program(home):
    compiled, eager = get("torch:compiled").prepare(tiny()), get("torch").prepare(tiny())
    compiled.run([x(2)])
    for scale in (2.0, -1.0):
        values = {n: v * scale for n, v in eager.parameters().items()}
        compiled.set_parameters(values)
        eager.set_parameters(values)
        np.testing.assert_allclose(compiled.run([x(2)])[0], eager.run([x(2)])[0], rtol=1e-5)
    with torch.no_grad():  # a write through the native module, as an optimizer step makes
        compiled.native.values["w"].mul_(3.0)
        eager.native.values["w"].mul_(3.0)
    np.testing.assert_allclose(compiled.run([x(2)])[0], eager.run([x(2)])[0], rtol=1e-5)


def scaled_exp(alpha: float):
    """y = alpha * exp(x), alpha a 0-d Constant node (as in Elu's expanded function)."""
    nodes = [helper.make_node("Constant", [], ["alpha"], value_float=alpha),
             helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Mul", ["alpha", "e"], ["y"])]
    graph = helper.make_graph(nodes, "scaled_exp",
                              [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_programs_that_differ_only_in_a_scalar_constant_never_share_a_cached_one(home):
    """Inductor inlines a 0-d constant into its kernels, and with freezing its graph cache keyed
    such a constant by shape and dtype only: the second of two models that differ only in one
    ran the first one's program (test_elu_default_expanded_ver18 computed Elu with alpha 2)."""
    zeros = np.zeros((2, 4), np.float32)
    for alpha in (2.0, 1.0, 3.0):  # each after the one before it sits in the cache
        [y] = get("torch:compiled").prepare(scaled_exp(alpha)).run([zeros])
        np.testing.assert_array_equal(y, np.full((2, 4), alpha, np.float32))


def test_level_0_gradients_are_refused_rather_than_run_eagerly_under_its_name(home):
    """(Its training step compiles: tests/backends/test_torch_compiled_training.py.)"""
    compiled = get("torch:compiled").prepare(tiny())
    with pytest.raises(NotImplementedError, match="level 0"):
        compiled.gradients([x(0)], output="y")


CHILD = """
import json, sys, numpy as np, onnx
from d500.backends import get
exe = get("torch:compiled").prepare(onnx.load(sys.argv[1]))
exe.run([np.ones((2, 4), np.float32)])
print(json.dumps({"compile_time": exe.compile_time}))
"""


def test_a_second_process_reuses_the_compiled_kernels_under_d500_home(tmp_path):
    """With freezing, Inductor's FX-graph cache steps aside (oneDNN-packed weights do not
    pickle): the second process traces and lowers again, but builds no C++ kernel anew."""
    import onnx
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny(), path)
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["D500_HOME"] = str(tmp_path / "home")
    cache = tmp_path / "home" / "cache" / "torch-inductor"

    def child() -> tuple[float, set]:
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        built = {p.relative_to(cache) for p in cache.rglob("*.so")}
        return json.loads(done.stdout.strip().splitlines()[-1])["compile_time"], built

    (first, built), (second, rebuilt) = child(), child()
    assert built and rebuilt == built  # kernels were built once, into D500_HOME
    assert first > 0 and second > 0


def test_a_bench_records_the_compile_time_apart_from_the_first_call(tmp_path, home):
    from d500.ledger import Ledger
    from d500.networks import workloads
    from d500.networks.bench import bench
    from tests.helpers import tiny_mlp
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_mlp(metrics=["latency", "agreement", "first_call_time"],
                             batch_size=2, budget=0.05))
    result = bench(workloads.load(path), ["torch", "torch:compiled"])
    assert result.exit_code == 0, [r.error for r in result.results]
    runs = {r["backend"]: r for r in Ledger().runs(level=1, workload="tiny-mlp")}
    compiled, eager = runs["torch:compiled"], runs["torch"]
    assert "compile_time" not in eager["figures"]
    figures = compiled["figures"]
    assert 0 < figures["compile_time"] <= figures["first_call_time"]
    assert figures["agreement"] < 1e-5 and figures["latency"] > 0
    assert compiled["details"]["settings"]["freezing"] is True
    assert "baked_inputs" not in compiled["details"]  # the MLP's input stays an input
    assert compiled["details"]["compile"] == {"cache": "cold"}  # a fresh D500_HOME
    from d500.leaderboard import modes, ranking
    [row] = modes.view(ranking.build(Ledger(), level=1)).rows  # torch at its best mode
    assert row[1] == "torch" and row[3] in ("torch", "torch:compiled")
    assert "torch:compiled" in row[6] and "(compile " in row[6] and "0 / 1 warm cache" in row[6]


def test_a_bench_records_a_baked_data_input(tmp_path, home):
    """A model whose output shape depends on its image's values (a NonZero) has the image baked
    into its program: repeated on one input, Inductor may fold it all; the run says so."""
    from d500.networks.bench import BackendBench, first_call
    nodes = [helper.make_node("NonZero", ["x"], ["n"])]
    graph = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("n", T.INT64, [2, "k"])])
    import onnx
    path = tmp_path / "nz.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    r = BackendBench("torch:compiled")
    assert first_call(r, get("torch:compiled"), path, {"x": x(3)}) is not None
    assert r.details["baked_inputs"] == ["x"] and r.figures["compile_time"] > 0
