"""The official ONNX backend test suite (onnx.backend.test.BackendTest) against every backend.

The minimums sit a little below the measured counts, so a regression fails CI. Measured with
onnx 1.23.2 over the 1,872 deterministic node tests (12 random-output tests left out):
reference 1,870 (ReferenceEvaluator alone: 1,863), torch 1,867, tensorflow 1,860,
onnxruntime 1.31.1: 1,438.
"""

from __future__ import annotations

import pytest

from d500 import backends
from d500.conformance import backend_test_counts

DETERMINISTIC_NODE_TESTS = 1872
MIN_NODE_PASSES = {"reference": 1868, "torch": 1855, "tensorflow": 1845, "onnxruntime": 1430}
# The real architectures shipped inside onnx (onnx/backend/test/data/light), no download.
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MIN_NODE_PASSES))
def test_node_suite_pass_count(name):
    counts = backend_test_counts(backends.get(name))
    assert counts["run"] - counts["skipped"] == DETERMINISTIC_NODE_TESTS
    assert counts["passed"] >= MIN_NODE_PASSES[name], counts["failed"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torch", "tensorflow"])
def test_light_real_models_pass(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ONNX_HOME", str(tmp_path))  # BackendTest writes expected outputs there
    counts = backend_test_counts(backends.get(name), kind="Real")
    assert counts["run"] == len(LIGHT_MODELS) and not counts["skipped"]
    assert counts["passed"] == len(LIGHT_MODELS), counts["failed"]
