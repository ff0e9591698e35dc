"""The language-model workload: the shipped python-stdlib corpus (digest, document split), the
byte-level BPE (deterministic), the transformer builder (against NumPy, causal, gradients across
backends) and level-2 runs of a tiny text workload with a lower-is-better target."""

from __future__ import annotations

import dataclasses
import json
import math
from math import erf
from pathlib import Path

import numpy as np
import pytest
import yaml

from d500 import builders
from d500.errors import ConfigError, DatasetError
from d500.ledger import Ledger
from d500.training import submission, workloads
from d500.training import trainer as supervisor
from d500.training.data import lm, text, tokenizer
from d500.training.data.splits import SplitSpec
from d500.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TEXT_LM = ROOT / "levels" / "2-training" / "text-lm.yaml"
ADAMW = ROOT / "submissions" / "adamw"
# a tiny split of the real corpus: 10 training documents, 2 + 2 held out, a 300-token BPE
TINY = lm.TextSpec("python-stdlib", train=10, validation=2, test=2, seed=3, context=16,
                   vocab=300)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return tmp_path / "home"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A results directory whose token cache holds TINY's tokens (prepared once per module)."""
    with pytest.MonkeyPatch.context() as patch:
        home = tmp_path_factory.mktemp("text") / "home"
        patch.setenv("D500_HOME", str(home))
        patch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
        lm.prepare(TINY)
        yield home


# -- the corpus --------------------------------------------------------------------------------
def test_the_shipped_corpus_matches_its_recorded_digest_and_licence():
    docs = text.documents()
    assert len(docs) == text.DOCUMENTS and [n for n, _ in docs] == sorted(n for n, _ in docs)
    assert sum(len(t) for _, t in docs) > 4_000_000  # a few MB: more than a small model holds
    assert all(n.endswith(".py") and t for n, t in docs)
    licence = (text.path().parent / text.LICENSE).read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in licence


def test_an_edited_corpus_file_is_refused_by_digest(tmp_path, monkeypatch, home):
    edited = tmp_path / text.FILE
    raw = bytearray(text.path().read_bytes())
    raw[len(raw) // 2] ^= 1  # one bit
    edited.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match=f"{edited}: sha256 .* is not the recorded"):
        text.documents(edited)
    monkeypatch.setattr(text, "path", lambda: edited)  # as if the installed file were edited
    with pytest.raises(DatasetError, match="is not the recorded"):
        lm.splits(TINY)
    monkeypatch.setattr(text, "path", lambda: tmp_path / "gone.jsonl.xz")
    with pytest.raises(DatasetError, match="gone.jsonl.xz: cannot read"):
        text.documents()


def test_the_split_is_by_document_disjoint_and_fixed_by_its_seed():
    spec = SplitSpec(150, 9, 9, 4)
    train_, val, test = lm.document_split(text.DOCUMENTS, spec)
    assert (len(train_), len(val), len(test)) == (150, 9, 9)
    assert not set(train_) & set(val) and not set(train_) & set(test) and not set(val) & set(test)
    assert lm.document_split(text.DOCUMENTS, spec) == (train_, val, test)
    assert lm.document_split(text.DOCUMENTS, SplitSpec(150, 9, 9, 5)) != (train_, val, test)
    # growing the training part never moves a validation or test document
    assert lm.document_split(text.DOCUMENTS, SplitSpec(100, 9, 9, 4))[1:] == (val, test)
    with pytest.raises(ConfigError, match="exceeds the corpus's 168"):
        lm.document_split(text.DOCUMENTS, SplitSpec(160, 5, 5, 0))


def test_each_split_holds_whole_documents_and_windows_predict_the_next_token(prepared):
    parts, files = lm.splits(TINY)
    docs = text.documents()
    _, val_docs, _ = lm.document_split(len(docs), TINY.split())
    tok = tokenizer.load(next(Path(prepared, "cache", "text").glob("*.tokenizer.json"))
                         .read_text())
    ids = tokenizer.encode(tok, [docs[i][1] for i in val_docs])
    flat = parts.validation.x.ravel()
    assert np.array_equal(flat, ids[:len(flat)])  # the validation documents, whole, in order
    assert np.array_equal(parts.validation.y[:, :-1], parts.validation.x[:, 1:])
    assert parts.train.x.dtype == np.int64 and parts.train.x.shape[1] == TINY.context
    assert int(parts.train.x.max()) < TINY.vocab
    assert files[text.FILE] == f"sha256:{text.SHA256}"


# -- the tokenizer -----------------------------------------------------------------------------
def test_the_byte_level_bpe_is_deterministic_and_lossless():
    docs = [t for _, t in text.documents()[:12]]
    a, b = tokenizer.train(docs, 400), tokenizer.train(docs, 400)
    assert tokenizer.sha256(a) == tokenizer.sha256(b) and a.get_vocab_size() == 400
    sample = "def f(x):\n    return x ** 2  # é, 你好\n"
    assert a.decode(a.encode(sample).ids) == sample  # byte level: nothing is unknown
    assert tokenizer.sha256(tokenizer.train(docs[:6], 400)) != tokenizer.sha256(a)


def test_the_token_cache_is_checked_against_the_workloads_digest(home):
    first = lm.prepare(TINY)
    digest = lm.tokens_digest(lm._read(first))
    pinned = lm.TextSpec(**{**TINY.__dict__, "tokens_sha256": digest})
    with np.load(first) as data:  # an edited cache: one token changed
        arrays = {k: data[k].copy() for k in data.files}
    arrays["validation"][0] += 1
    np.savez(first, **arrays)
    assert lm.prepare(pinned) == first  # rebuilt, because it no longer matched
    assert lm.tokens_digest(lm._read(first)) == digest
    wrong = lm.TextSpec(**{**TINY.__dict__, "tokens_sha256": "0" * 64})
    with pytest.raises(DatasetError, match="not the workload's tokens_sha256"):
        lm.prepare(wrong)


@pytest.mark.slow
def test_the_shipped_workloads_tokens_rebuild_to_their_recorded_digest(home):
    """A fresh tokenizer and tokens for text-lm (17 s here): what every machine with the pinned
    tokenizers version prepares, so the workload's tokens_sha256 holds there too."""
    from d500.training.data.dataset import text_spec
    spec = text_spec(workloads.load(TEXT_LM).dataset)
    assert spec.tokens_sha256 is not None
    assert lm.tokens_digest(lm._read(lm.prepare(spec))) == spec.tokens_sha256


# -- the builder -------------------------------------------------------------------------------
def _layernorm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * scale + bias


def _numpy_lm(weights: dict, tokens: np.ndarray, layers: int, heads: int) -> np.ndarray:
    """The transformer's logits written out in NumPy (float64)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    n, t = tokens.shape
    h = w["wte"][tokens] + w["wpe"]
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))))
    linear, ln = iter(range(1, 6 * layers + 1)), iter(range(1, 2 * layers + 2))

    def dense(x):
        i = next(linear)
        return x @ w[f"linear{i}.weight"] + w[f"linear{i}.bias"]

    def norm(x):
        i = next(ln)
        return _layernorm(x, w[f"ln{i}.scale"], w[f"ln{i}.bias"])

    for _ in range(layers):
        a = norm(h)
        d = h.shape[-1] // heads
        q, k, v = (dense(a).reshape(n, t, heads, d).transpose(0, 2, 1, 3) for _ in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + np.triu(np.full((t, t), -1e9), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        h = h + dense((p @ v).transpose(0, 2, 1, 3).reshape(n, t, -1))
        h = h + dense(gelu(dense(norm(h))))
    return norm(h) @ w["wte"].T


def _weights(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("backend", ["reference", "torch", "tensorflow"])
def test_the_transformer_computes_what_numpy_computes(backend):
    from d500 import backends
    model = builders.build_lm("transformer", 8, 50, seed=1, loss=True, layers=2, width=16,
                              heads=2)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 50, (3, 8)), rng.integers(0, 50, (3, 8))
    logits, loss = backends.get(backend).prepare(model).run({"input": x, "labels": y})
    want = _numpy_lm(_weights(model), x, layers=2, heads=2)
    assert logits.shape == (3, 8, 50)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    logp = want - np.log(np.exp(want).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert float(loss) == pytest.approx(nll, rel=1e-5)


def test_the_transformer_is_causal_and_untied_has_its_own_output():
    from d500 import backends
    model = builders.build_lm("transformer", 6, 40, seed=0, layers=1, width=8, heads=2)
    exe = backends.get("torch").prepare(model)
    x = np.arange(12).reshape(2, 6) % 40
    changed = x.copy()
    changed[:, 4] = 39
    a, b = exe.run({"input": x})[0], exe.run({"input": changed})[0]
    np.testing.assert_array_equal(a[:, :4], b[:, :4])  # no position sees its future
    assert not np.allclose(a[:, 4:], b[:, 4:])
    untied = builders.build_lm("transformer", 6, 40, seed=0, layers=1, width=8, heads=2,
                               tied=False)
    assert "output.weight" in _weights(untied) and "output.weight" not in _weights(model)
    with pytest.raises(Exception, match="width 10 is not a multiple of heads 4"):
        builders.build_lm("transformer", 6, 40, width=10, heads=4)


def test_gradients_agree_across_backends_and_with_finite_differences():
    """Every op of the transformer differentiated by torch and TensorFlow autograd and by the
    reference's NumPy VJPs (LayerNormalization through its function body; Gather, Gelu,
    Softmax, the tied Transpose): the three agree, and the reference agrees with central
    differences in float64 along a random direction."""
    from d500 import backends
    from d500.training.optimizers import make
    model = builders.build_lm("transformer", 6, 30, seed=2, loss=True, layers=1, width=8,
                              heads=2)
    rng = np.random.default_rng(1)
    feeds = {"input": rng.integers(0, 30, (2, 6)), "labels": rng.integers(0, 30, (2, 6))}
    grads = {}
    for name in ("reference", "torch", "tensorflow"):
        trainer = backends.get(name).prepare(model).trainer(make("sgd", lr=0.1), loss="loss")
        grads[name] = trainer.gradients(feeds)[1]
    for name in ("torch", "tensorflow"):
        for p, g in grads["reference"].items():
            np.testing.assert_allclose(grads[name][p], g, rtol=2e-3, atol=2e-6, err_msg=p)
    assert all(np.abs(grads["reference"][p]).sum() > 0 for p in ("wte", "wpe"))
    # central differences of the float64 NumPy loss along a random direction of every weight
    w = {k: v for k, v in _weights(model).items() if v.dtype == np.float32}
    direction = {k: rng.normal(size=v.shape) for k, v in w.items()}

    def loss(eps: float) -> float:
        moved = {k: v.astype(np.float64) + eps * direction[k] for k, v in w.items()}
        logits = _numpy_lm(moved, feeds["input"], layers=1, heads=2)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return -np.take_along_axis(logp, feeds["labels"][..., None], -1).mean()

    numeric = (loss(1e-5) - loss(-1e-5)) / 2e-5
    analytic = sum(float((grads["reference"][k] * direction[k]).sum()) for k in w)
    assert analytic == pytest.approx(numeric, rel=1e-3)


# -- the workload ------------------------------------------------------------------------------
def _tiny_workload(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(TEXT_LM.read_text())
    data.update(name="text-tiny", description="tiny", budget={"max_epochs": 1,
                                                             "max_seconds": 120},
                model={"builder": "transformer", "layers": 1, "width": 16, "heads": 2},
                dataset={**{k: getattr(TINY, k) for k in ("train", "validation", "test",
                                                          "context", "vocab")},
                         "name": TINY.name, "split_seed": TINY.seed},
                evaluation={"every_steps": 10}, target={"metric": "val_log_perplexity",
                                                        "value": 5.3})
    data.update(changes)
    path = tmp_path / "text-tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_text_lm_workload_is_valid_and_its_model_trains_on_the_real_corpus(prepared):
    wl = workloads.load(TEXT_LM)
    assert wl.text and wl.quality == "log_perplexity" and wl.lower_is_better
    assert wl.met(wl.target - 0.1) and not wl.met(wl.target + 0.1)
    from d500 import backends
    from d500.training.optimizers import make
    parts, _ = lm.splits(TINY)
    model = builders.build_lm("transformer", TINY.context, TINY.vocab, seed=0, loss=True,
                              layers=1, width=16, heads=2)
    trainer = backends.get("torch").prepare(model).trainer(make("adam", lr=0.01), loss="loss")
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(40):
        i = rng.integers(0, len(parts.train), 16)
        losses.append(trainer.step({"input": parts.train.x[i], "labels": parts.train.y[i]},
                                   lr=0.01))
    assert losses[0] == pytest.approx(math.log(TINY.vocab), abs=0.2)  # uniform at the start
    assert np.mean(losses[-5:]) < losses[0] - 1.0


def test_a_text_run_meets_a_lower_is_better_target_and_records_perplexity(prepared, tmp_path):
    from d500 import mllog
    from d500.competition import compliance
    wl = workloads.load(_tiny_workload(tmp_path))
    entry = submission.load(ADAMW)
    ledger = Ledger()
    result = train(wl, entry.recipe, "torch", seed=0, ledger=ledger, submission=entry.name)
    assert result.status == "succeeded", result.error
    f = ledger.get(result.run_id)["figures"]
    assert f["val_log_perplexity"] <= wl.target < math.log(TINY.vocab)
    assert f["test_perplexity"] == pytest.approx(math.exp(f["test_log_perplexity"]))
    evals = ledger.evaluations(result.run_id)
    assert all(e["metrics"]["val_log_perplexity"] > wl.target for e in evals[:-1])
    assert evals[-1]["wall_time"] == pytest.approx(f["time_to_accuracy"])
    path = Path(ledger.get(result.run_id)["mllog"].replace("$D500_HOME", str(ledger.root)))
    # MLPerf's 6.1.0 checker, attention's precision required of a language model's log: a log
    # without that line fails it (the digits networks, which have no attention, are not held to it)
    assert compliance.problems(path, level=2, attention=True) == []
    cut = tmp_path / "no-attn.mllog.txt"
    cut.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                           if mllog.PRECISION_ATTN not in line))
    assert compliance.problems(cut, level=2) == []
    assert any(mllog.PRECISION_ATTN in p for p in compliance.problems(cut, 2, attention=True))
    values = [r["value"] for r in mllog.parse(path) if r["key"] == "eval_accuracy"]
    assert values == [e["metrics"]["val_log_perplexity"] for e in evals]
    assert ledger.verify() == []
    # d500 check's consistency step reads the record and the log the same way (a forged
    # test_log_perplexity or an eval_accuracy line above the target disagree)
    from types import SimpleNamespace

    from d500.competition import consistency, consistency_training
    record = ledger.get(result.run_id)
    rules = consistency.rules(wl.path.read_text(), wl.path.name)
    assert rules.lower and rules.quality == "log_perplexity" and rules.train is None
    digits = ROOT / "levels" / "2-training" / "digits-mlp.yaml"
    assert rules.text and not consistency.rules(digits.read_text(), digits.name).text

    def problems(figures: dict, records: list) -> list[str]:
        run = SimpleNamespace(status="succeeded", figures=figures, level=2, world_size=None,
                              hyperparameters=record["hyperparameters"], evaluations=[
                                  [e["step"], e["epoch"], e["wall_time"],
                                   json.dumps(e["metrics"]), e["recorded"]] for e in evals])
        return consistency_training.Training(run, records, rules).problems()

    records = mllog.parse(path)
    assert problems(f, records) == []
    assert any("test_log_perplexity" in p for p in problems(
        {**f, "test_log_perplexity": f["test_log_perplexity"] - 0.5}, records))
    # against an unreachable target the run would miss, saying what it measured
    state = {"val": f["val_log_perplexity"], "step": 7}
    unreachable = dataclasses.replace(wl, target=round(f["val_log_perplexity"] - 1.0, 4))
    assert supervisor._why(unreachable, state, "missed").startswith(
        f"validation log-perplexity {f['val_log_perplexity']:.4f} after 7 steps did not reach")


@pytest.mark.parametrize("change, message", [
    ({"target": {"metric": "val_accuracy", "value": 0.5}}, "does not fit dataset"),
    ({"dataset": {"name": "python-stdlib", "train": 10, "validation": 2, "test": 2}},
     "'dataset.context' must be a positive integer"),
    ({"model": {"builder": "mlp"}}, "must be a causal language-model builder"),
    # the bidirectional encoder would see each next token it is asked to predict
    ({"model": {"builder": "encoder"}}, "must be a causal language-model builder"),
    ({"dataset": {"name": "digits", "train": 100, "validation": 50, "test": 50,
                  "context": 8}}, "'dataset.context' is for text corpora"),
])
def test_bad_text_workloads_are_refused_by_field(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        workloads.load(_tiny_workload(tmp_path, **change))


def test_a_run_missed_though_its_last_evaluation_meets_the_target_says_why():
    """A run whose time budget ran out before the evaluation that met the target is missed; its
    error says the target was met only after the budget, not that it was not reached."""
    wl = workloads.load(TEXT_LM)
    late = supervisor._why(wl, {"val": 4.301, "step": 306}, "missed")
    assert "met the target 4.5 only at the evaluation after the budget" in late
    assert "900 s" in late and "did not reach" not in late
    short = supervisor._why(wl, {"val": 4.678, "step": 200}, "missed")
    assert "4.6780 after 200 steps did not reach the target 4.5 within the budget" in short
    assert supervisor._why(wl, {"val": 4.1, "step": 400}, "succeeded") == ""
