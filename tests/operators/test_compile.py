"""C operators: compiled once into D500_HOME, rebuilt when the source changes, errors shown."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from d500.operators.base import load_class
from d500.operators.compile import CompileError, build
from d500.operators.validate import validate
from d500.operators.workloads import Case

from .conftest import OPS, case, op


def test_compiled_once_into_the_cache_and_reused(home):
    first = build(OPS / "relu.c")
    assert first.path.is_relative_to(home / "cache" / "operators")
    mtime = first.path.stat().st_mtime_ns
    assert build(OPS / "relu.c").path == first.path
    assert first.path.stat().st_mtime_ns == mtime
    assert first.has_backward


def test_rebuilt_when_the_source_changes(tmp_path):
    for name in ("relu.c", "c_ops.py"):
        shutil.copy(OPS / name, tmp_path / name)
    relu = load_class(tmp_path / "c_ops.py", "CRelu").cls
    x = np.array([-2.0, 3.0], dtype=np.float32)
    assert relu().forward(x)[0].tolist() == [0.0, 3.0]
    before = build(tmp_path / "relu.c").path
    source = (tmp_path / "relu.c").read_text()
    (tmp_path / "relu.c").write_text(source.replace("#define NEGATIVE_SLOPE 0.0f",
                                                    "#define NEGATIVE_SLOPE 0.5f"))
    after = build(tmp_path / "relu.c").path
    assert after != before and after.exists()
    assert relu().forward(x)[0].tolist() == [-1.0, 3.0]


def test_compiler_errors_are_shown_as_such():
    with pytest.raises(CompileError) as err:
        build(OPS / "does_not_compile.c")
    assert "does_not_compile.c" in str(err.value) and "error" in str(err.value)
    assert "undeclared_variable" in err.value.output
    assert "\n" not in str(err.value)


def test_c_operator_validates_and_its_broken_variant_fails():
    assert validate(op("c_ops.py", "CRelu"), case("relu-4d")).passed
    leaky = validate(op("c_ops.py", "LeakyCRelu"), case("relu-4d"))
    assert not leaky.passed
    assert any(c.kind == "output" and not c.passed for c in leaky.checks)


def test_c_operator_without_float64_is_checked_in_float32():
    report = validate(op("c_ops.py", "CRelu"), Case("relu-small", "Relu", [(3, 5)]))
    assert report.passed and report.gradient_dtype == "float32"
    gemm = validate(load_class(OPS.parents[2] / "submissions/c-gemm/gemm.py", "CGemm").cls,
                    case("gemm-small"))
    assert gemm.passed and gemm.gradient_dtype == "float64"
    assert {c.name for c in gemm.checks if c.kind == "gradient"} == {"dA", "dB", "dC"}
