"""The network builders: valid ONNX, the architectures' sizes, seeded, same on two runtimes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from d500.backends.onnxruntime import OnnxRuntimeBackend
from d500.backends.reference import ReferenceBackend
from d500.builders import BUILDERS, SHAPES, build
from d500.errors import UsageError

CASES = [(name, shape) for name in BUILDERS for shape in SHAPES.values()]


def n_params(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer)


@pytest.mark.parametrize(("name", "shape"), CASES, ids=[f"{n}-{'x'.join(map(str, s))}"
                                                         for n, s in CASES])
def test_builds_check_and_agree_between_reference_and_onnxruntime(name, shape):
    model = build(name, shape, classes=10, seed=3, loss=True)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].domain == "" and model.opset_import[0].version >= 17
    assert [i.name for i in model.graph.input] == ["input", "labels"]
    assert [o.name for o in model.graph.output] == ["logits", "loss"]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == list(shape)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, *shape)).astype(np.float32)
    labels = np.array([0, 4, 9], dtype=np.int64)
    ref = ReferenceBackend.prepare(model).run([x, labels])
    ort = OnnxRuntimeBackend.prepare(model).run([x, labels])
    assert ref[0].shape == (3, 10) and ref[1].shape == ()
    np.testing.assert_allclose(ort[0], ref[0], rtol=1e-4, atol=1e-4)
    # The loss output is the mean cross-entropy of the logits output.
    logp = ref[0] - np.log(np.exp(ref[0] - ref[0].max(1, keepdims=True)).sum(1, keepdims=True)) \
        - ref[0].max(1, keepdims=True)
    assert ref[1] == pytest.approx(-logp[np.arange(3), labels].mean(), rel=1e-5)
    assert ort[1] == pytest.approx(ref[1], rel=1e-4)
    # Not a dead network: the samples get different logits.
    assert np.all(np.isfinite(ref[0])) and np.ptp(ref[0], axis=0).min() > 0


def test_parameter_counts_match_the_published_architectures():
    # LeNet-5 (LeCun et al. 1998) with a 10-way output: 61,706 weights on 32x32 and, padded, 28x28.
    assert n_params(build("lenet5", (1, 32, 32))) == 61_706
    assert n_params(build("lenet5", (1, 28, 28))) == 61_706
    # ResNet-20 for CIFAR-10: about 0.27 M weights (He et al. 2016); projection shortcuts add a few.
    resnet = build("resnet20", (3, 32, 32))
    weights = sum(int(np.prod(t.dims)) for t in resnet.graph.initializer
                  if not t.name.endswith((".mean", ".var")))
    assert 0.26e6 < weights < 0.29e6
    convs = [n for n in resnet.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 + 2 * 9 + 2  # stem, 9 blocks of two, 2 projection shortcuts
    assert sum(n.op_type == "Gemm" for n in resnet.graph.node) == 1
    # MLP: 784-128-64-10.
    assert n_params(build("mlp", (1, 28, 28))) == 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10


def test_seed_decides_the_weights():
    a, b, c = (build("lenet5", "digits", seed=s) for s in (1, 1, 2))
    assert a.SerializeToString() == b.SerializeToString()
    wa, wc = (onnx.numpy_helper.to_array(m.graph.initializer[0]) for m in (a, c))
    assert not np.array_equal(wa, wc)
    # He initialization: standard deviation sqrt(2 / fan_in).
    w = onnx.numpy_helper.to_array(build("mlp", (1, 28, 28), seed=0).graph.initializer[0])
    assert w.std() == pytest.approx(np.sqrt(2 / 784), rel=0.02)


def test_without_loss_only_logits_and_classes_count():
    model = build("mlp", "digits", classes=3)
    assert [i.name for i in model.graph.input] == ["input"]
    out = ReferenceBackend.prepare(model).run([np.zeros((2, 1, 8, 8), np.float32)])
    assert [o.shape for o in out] == [(2, 3)]


@pytest.mark.parametrize(("args", "words"), [
    (("vgg16",), ["vgg16", "mlp", "lenet5", "resnet20"]),
    (("mlp", "imagenet"), ["imagenet", "digits"]),
    (("mlp", (28, 28)), ["(28, 28)", "(C, H, W)"]),
    (("lenet5", (1, 4, 4)), ["too small", "lenet5"]),
    (("mlp", (1, 0, 8)), ["positive"]),
])
def test_bad_names_and_shapes_are_usage_errors(args, words):
    with pytest.raises(UsageError) as err:
        build(*args)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


def test_bad_classes():
    with pytest.raises(UsageError, match="classes"):
        build("mlp", classes=1)
