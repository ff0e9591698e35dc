"""A text run's training windows known to d500 check where its workload pins its tokens
(tokens_sha256, lm.TOKENS): its evaluations' epochs and cadence are checked as an image run's
(the text split counts documents, so check skipped them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from d500 import mllog
from d500.competition import consistency, consistency_training
from d500.errors import DatasetError
from d500.ledger import Ledger
from d500.training import submission, workloads
from d500.training.data import lm
from d500.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TEXT_LM = ROOT / "levels" / "2-training" / "text-lm.yaml"
ADAMW = ROOT / "submissions" / "adamw"
TINY = lm.TextSpec("python-stdlib", train=10, validation=2, test=2, seed=3, context=16,
                   vocab=300)


@pytest.fixture
def pinned(tmp_path, monkeypatch) -> tuple[str, dict[str, np.ndarray]]:
    """TINY's tokens prepared in a fresh home, their digest pinned in lm.TOKENS as the
    rulebook's text-lm tokens are."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    with np.load(lm.prepare(TINY)) as data:
        arrays = {p: np.asarray(data[p]) for p in lm.PARTS}
    digest = lm.tokens_digest(arrays)
    monkeypatch.setitem(lm.TOKENS, digest, (len(arrays["train"]), len(arrays["validation"])))
    return digest, arrays


def _workload(tmp_path: Path, digest: str) -> Path:
    data = yaml.safe_load(TEXT_LM.read_text())
    data.update(name="text-tiny", description="tiny", budget={"max_epochs": 1,
                                                             "max_seconds": 120},
                model={"builder": "transformer", "layers": 1, "width": 16, "heads": 2},
                dataset={**{k: getattr(TINY, k) for k in ("train", "validation", "test",
                                                          "context", "vocab")},
                         "name": TINY.name, "split_seed": TINY.seed, "tokens_sha256": digest},
                evaluation={"every_steps": 10}, target={"metric": "val_log_perplexity",
                                                        "value": 10.0})  # met at step 10
    path = tmp_path / "text-tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_rulebooks_text_lm_windows_are_known_to_check():
    rules = consistency.rules(TEXT_LM.read_text(), TEXT_LM.name)
    train, validation = lm.TOKENS[yaml.safe_load(TEXT_LM.read_text())["dataset"]["tokens_sha256"]]
    assert (rules.train, rules.validation) == ((train - 1) // 64, (validation - 1) // 64)


def test_tokens_whose_counts_are_not_the_pinned_ones_are_refused(pinned, monkeypatch):
    digest, _ = pinned
    monkeypatch.setitem(lm.TOKENS, digest, (1, 1))
    with pytest.raises(DatasetError, match="lm.TOKENS records"):
        lm.splits(dataclasses.replace(TINY, tokens_sha256=digest))


def test_a_text_runs_steps_doubled_alike_are_off_its_epochs(pinned, tmp_path):
    """An honest tiny text run passes; its steps, samples and epochs doubled in the record and
    the log alike passed with the windows unknown (rules.train None), and fail now."""
    digest, arrays = pinned
    wl = workloads.load(_workload(tmp_path, digest))
    entry = submission.load(ADAMW)
    ledger = Ledger()
    result = train(wl, entry.recipe, "torch", seed=0, ledger=ledger, submission=entry.name)
    assert result.status == "succeeded", result.error
    record, evals = ledger.get(result.run_id), ledger.evaluations(result.run_id)
    rules = consistency.rules(wl.path.read_text(), wl.path.name)
    assert rules.train == (len(arrays["train"]) - 1) // TINY.context
    path = Path(record["mllog"].replace("$D500_HOME", str(ledger.root)))

    def problems(factor: int, rules) -> list[str]:
        records = mllog.parse(path)
        for r in records:
            meta = r["metadata"]
            if "samples_count" in meta:
                meta["samples_count"] *= factor
            if "epoch_num" in meta and r["key"].startswith("eval"):
                meta["epoch_num"] *= factor
        figures = {**record["figures"], **{k: record["figures"][k] * factor for k in (
            "epochs", "steps", "samples_per_second") if k in record["figures"]}}
        run = SimpleNamespace(status=record["status"], figures=figures, level=2,
                              world_size=None, details=record.get("details"), row=record,
                              hyperparameters=record["hyperparameters"], evaluations=[
                                  [e["step"] * factor, e["epoch"] * factor, e["wall_time"],
                                   json.dumps(e["metrics"]), e["recorded"]] for e in evals])
        return consistency_training.Training(run, records, rules).problems()

    assert problems(1, rules) == []
    unknown = dataclasses.replace(rules, train=None, validation=None)
    assert problems(2, unknown) == []  # the hole: the windows unknown, nothing to hold it to
    assert [p for p in problems(2, rules) if p.startswith("evaluation 1 (epoch ") and
            p.endswith("at step 20, but the rules evaluate every 10 steps, next at step 10")], \
        problems(2, rules)
