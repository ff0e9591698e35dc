"""The BERT-base-shaped level-1 workload (levels/1-networks/bert-base-shaped.yaml) and its builder,
d500.builders.encoder: BERT-base's shape, every token seen by every other (unlike the causal
transformer), and the backends agreeing with a NumPy BERT written here from the paper's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper
from scipy.special import erf

from d500 import backends
from d500.builders import build_lm
from d500.networks import inputs, workloads

BERT = Path(__file__).resolve().parents[2] / "levels" / "1-networks" / "bert-base-shaped.yaml"
SMALL = {"layers": 2, "width": 32, "heads": 4}  # the builder's full shape is 12 / 768 / 12


def test_the_workload_is_bert_base_at_sequence_128_batch_1():
    wl = workloads.load(BERT)
    m = wl.model
    assert (m["builder"], m["layers"], m["width"], m["heads"]) == ("encoder", 12, 768, 12)
    assert (m["context"], m["vocab"], wl.batch_size, wl.rank_by) == (128, 30522, 1, "latency")
    assert workloads.find("bert-base-shaped") == BERT


def _layernorm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * scale + bias


def numpy_bert(model, tokens: np.ndarray, heads: int) -> np.ndarray:
    """BERT's forward pass (post-LN, erf GELU, tied output) in float64 NumPy, reading the weights
    by their order in the builder: embeddings' LayerNorm, then per layer Q, K, V, O, LayerNorm,
    the two feed-forward linears, LayerNorm."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    lin = iter(range(1, 10**6))
    ln = iter(range(1, 10**6))

    def linear(x):
        i = next(lin)
        return x @ w[f"linear{i}.weight"] + w[f"linear{i}.bias"]

    def norm(x):
        i = next(ln)
        return _layernorm(x, w[f"ln{i}.scale"], w[f"ln{i}.bias"])

    h = norm(w["wte"][tokens] + w["wpe"])
    n, t, width = h.shape
    for _ in range(sum(1 for k in w if k.endswith(".scale")) // 2):
        q, k, v = (linear(h).reshape(n, t, heads, -1).transpose(0, 2, 1, 3) for _ in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(width // heads)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(n, t, width)
        h = norm(h + linear(o))
        f = linear(h)
        h = norm(h + linear(0.5 * f * (1 + erf(f / np.sqrt(2)))))
    return h @ w["wte"].T


@pytest.mark.parametrize("backend", ["reference", "torch", "onnxruntime", "tensorflow", "jax"])
def test_every_backend_computes_bert_as_the_paper_writes_it(backend):
    if not backends.is_installed(backend):
        pytest.skip(f"{backend} is not installed")
    model = build_lm("encoder", 16, 50, seed=3, **SMALL)
    tokens = inputs.make(model, seed=1, batch=2)["input"]
    assert tokens.shape == (2, 16) and 40 < tokens.max() < 50  # the whole vocabulary
    expected = numpy_bert(model, tokens, SMALL["heads"])
    got = backends.get(backend).prepare(model).run({"input": tokens})[0]
    assert got.shape == (2, 16, 50) and got.dtype == np.float32
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_the_encoder_sees_later_tokens_and_the_transformer_does_not():
    tokens = np.arange(8, dtype=np.int64)[None] % 20
    later = tokens.copy()
    later[0, -1] = 19  # only the last token changes
    for name, sees in (("encoder", True), ("transformer", False)):
        exe = backends.get("onnxruntime").prepare(build_lm(name, 8, 20, **SMALL))
        first, changed = (exe.run({"input": x})[0][0, 0] for x in (tokens, later))
        assert (np.max(np.abs(first - changed)) > 1e-6) == sees, name
