"""Level-2 workload files (`levels/2-training/*.yaml`): the fixed rules of a training benchmark.

    model: {builder: lenet5, input_shape: [1, 8, 8], classes: 10}  # or file: x.onnx, loss: loss
    dataset: {name: digits, train: 1197, validation: 300, test: 300, split_seed: 0}
    batch_size: {min: 8, max: 256}      # what a submission may choose within
    drop_last: true
    evaluation: {every_epochs: 1}       # or {every_steps: N}: the validation cadence
    target: {metric: val_accuracy, value: 0.97}   # read on validation only (or
                                                  # val_log_perplexity, lower is better)
    budget: {max_epochs: 30, max_seconds: 300}    # the target not met within it: missed
    tuning: {studies: 3, trials: 5, seed: 0}      # AlgoPerf-style external tuning (level 2)
    seeds: 3                                       # runs per entry for the variance figures
    seed_runs: 6      # optional, MLPerf's M > N: 6 seed runs, the 3 consecutive closest to
                      # their median score (d500.training.window); default: `seeds`

A language-model workload reads a text corpus (d500.training.data.lm): `dataset` counts documents
and adds `context` (tokens per window) and `vocab` (the byte-level BPE's size); its `model` is a
language-model builder (`transformer`, with layers, width, heads, tied); its target is
`val_log_perplexity`, the mean next-token cross-entropy in nats on the validation documents.

The model's weights are initialised from the run's seed (a builder's `seed`), so the spread over
seeds includes initialisation as well as data order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d500 import workload as _workload
from d500.competition import convergence
from d500.errors import ConfigError
from d500.training.data.dataset import KNOWN, TEXT
from d500.training.precision import PRECISIONS
from d500.workload import COMMON, Field

# What `d500 train` measures; a workload lists a subset of these.
MEASURED = ("time_to_accuracy", "val_accuracy", "test_accuracy", "final_test_accuracy",
            "val_log_perplexity", "test_log_perplexity", "final_test_log_perplexity",
            "test_perplexity", "train_loss", "epochs", "steps", "samples_per_second",
            "train_time", "eval_time", "data_time")
# What a stop rule may read (validation only) -> the quality it measures: the run records
# val_<quality> at every evaluation, test_<quality> at the target, final_test_<quality> at the end.
QUALITIES = {"val_accuracy": "accuracy", "val_log_perplexity": "log_perplexity"}
TARGET_METRICS = tuple(QUALITIES)
LM_OPTIONS = ("layers", "width", "heads", "tied")  # a language-model builder's fields

MODEL = {
    "builder": Field(str, help="a d500 builder: mlp, lenet5, resnet20"),
    "input_shape": Field(list, items=int, help="builder: (C, H, W); default: the dataset's"),
    "classes": Field(int, help="builder: number of classes; default: the dataset's"),
    "file": Field("path", help="an ONNX file with inputs (input, labels) and outputs "
                               "(logits, loss), relative to the workload file"),
    "layers": Field(int, help="transformer: decoder layers"),
    "width": Field(int, help="transformer: model width"),
    "heads": Field(int, help="transformer: attention heads"),
    "tied": Field(bool, help="transformer: output projection = token embedding transposed"),
}
DATASET = {
    "name": Field(str, required=True, choices=KNOWN),
    "train": Field(int, required=True),
    "validation": Field(int, required=True),
    "test": Field(int, required=True),
    "split_seed": Field(int, default=0),
    "context": Field(int, help="text: tokens per window"),
    "vocab": Field(int, help="text: the byte-level BPE's vocabulary size"),
    "tokens_sha256": Field(str, help="text: sha256 of the prepared tokens (lm.tokens_digest)"),
}
SCHEMA = {
    **COMMON,
    "level": _workload.level_field(2),
    "model": Field(MODEL, required=True),
    "dataset": Field(DATASET, required=True),
    "batch_size": Field({"min": Field(int, default=1), "max": Field(int, required=True)},
                        required=True),
    "drop_last": Field(bool, default=True),
    "evaluation": Field({"every_epochs": Field(int), "every_steps": Field(int)},
                        default={"every_epochs": 1, "every_steps": None}),
    "target": Field({"metric": Field(str, required=True, choices=TARGET_METRICS),
                     "value": Field(float, required=True)}, required=True),
    "budget": Field({"max_epochs": Field(int, required=True),
                     "max_seconds": Field(float, default=3600.0)}, required=True),
    "tuning": Field({"studies": Field(int, default=3), "trials": Field(int, default=5),
                     "seed": Field(int, default=0)},
                    default={"studies": 3, "trials": 5, "seed": 0}),
    "seeds": Field(int, default=3),
    "seed_runs": Field(int, help="MLPerf's M > N: seed runs every entry makes, of which "
                                 "`seeds` consecutive score (default: `seeds`)"),
    **{convergence.key(p): Field(dict, help=f"d500.competition.convergence: reference runs in {p}")
       for p in PRECISIONS},
    "lowest_precision": Field(str, default="fp32", choices=PRECISIONS,
                              help="the lowest precision a recipe may train in "
                                   "(d500.training.precision)"),
}


@dataclass
class Workload:
    """A validated level-2 workload."""

    path: Path
    level: int
    name: str
    description: str
    metrics: list[str]
    rank_by: str
    aggregate: str
    model: dict[str, Any]
    dataset: dict[str, Any]
    batch_min: int
    batch_max: int
    drop_last: bool
    every_epochs: int | None
    every_steps: int | None
    target_metric: str
    target: float
    max_epochs: int
    max_seconds: float
    studies: int  # its `tuning:` (0, 0, 0 for a workload that has none: level 3)
    trials: int
    tuning_seed: int
    seeds: int  # N: seed runs that score
    seed_runs: int = 0  # M >= N: seed runs the rules derive and every entry makes (0: N)
    lowest_precision: str = "fp32"  # a recipe's precision may not be lower (precision.py)

    @property
    def tuned(self) -> bool:
        """Whether the workload has tuning studies for `d500 tune` (level 3 has none)."""
        return self.studies > 0

    @property
    def text(self) -> bool:
        """Whether the workload is a language model over a text corpus."""
        return self.dataset["name"] in TEXT

    @property
    def quality(self) -> str:
        """What an evaluation measures: "accuracy" or "log_perplexity" (QUALITIES)."""
        return QUALITIES[self.target_metric]

    @property
    def lower_is_better(self) -> bool:
        """The target metric's direction, as its definition in metrics/ says."""
        from d500 import metrics
        return metrics.get(self.target_metric).lower_is_better

    def met(self, value: float) -> bool:
        """Whether a validation figure meets the target (at or beyond it, in its direction)."""
        return value <= self.target if self.lower_is_better else value >= self.target

    def split_spec(self) -> Any:
        from d500.training.data.splits import SplitSpec
        d = self.dataset
        return SplitSpec(d["train"], d["validation"], d["test"], d["split_seed"])

    def build_model(self, seed: int, input_shape: tuple[int, ...], classes: int) -> Any:
        """The ONNX model (inputs `input`, `labels`; outputs `logits`, `loss`), weights from
        `seed` for a builder."""
        from d500 import builders
        from d500.model import load
        m = self.model
        if m.get("file") is not None:
            return load(m["file"])
        shape = tuple(m.get("input_shape") or input_shape)
        if shape != tuple(input_shape):
            raise ConfigError(f"{self.path}: field 'model.input_shape' is {list(shape)} but the "
                              f"dataset '{self.dataset['name']}' has {list(input_shape)}")
        n = m.get("classes") or classes
        if self.text:
            options = {k: m[k] for k in LM_OPTIONS if m.get(k) is not None}
            return builders.build_lm(m["builder"], shape[0], n, seed=seed, loss=True, **options)
        return builders.build(m["builder"], input_shape=shape, classes=n, seed=seed, loss=True)


def _check_text(d: dict[str, Any], m: dict[str, Any], path: Path) -> None:
    """The fields a text corpus needs (context, vocab, a language-model builder), and that an
    image dataset has none of them."""
    from d500.builders import CAUSAL
    if d["name"] in TEXT:
        for key in ("context", "vocab"):
            if d[key] is None or d[key] < 1:
                raise ConfigError(f"{path}: field 'dataset.{key}' must be a positive integer for "
                                  f"the text corpus '{d['name']}'")
        if m.get("file") is None and m.get("builder") not in CAUSAL:
            raise ConfigError(f"{path}: field 'model.builder' must be a causal language-model "
                              f"builder ({', '.join(CAUSAL)}) for the text corpus '{d['name']}' "
                              f"(next-token training; an encoder sees the next token)")
        return
    for key in ("context", "vocab", "tokens_sha256"):
        if d[key] is not None:
            raise ConfigError(f"{path}: field 'dataset.{key}' is for text corpora, not "
                              f"'{d['name']}'")
    for key in LM_OPTIONS:
        if m.get(key) is not None:
            raise ConfigError(f"{path}: field 'model.{key}' is for language-model builders")


def load(path: str | Path, text: str | bytes | None = None) -> Workload:
    """Read and check a training workload (level 2, or level 3 through its own schema on top;
    `text`: the file's content, read from elsewhere); every problem is a ConfigError naming the
    field."""
    path = Path(path)
    data = _workload.load(path, SCHEMA, text=text)
    return from_data(path, data)


def from_data(path: Path, data: dict[str, Any], measured: tuple[str, ...] = MEASURED) -> Workload:
    """A Workload from validated fields (level 3 validates more fields on top, names the
    metrics it measures, and has no `tuning` field)."""
    m = data["model"]
    _workload.model_source(m, path, ("builder", "file"))
    d = data["dataset"]
    for key in ("train", "validation", "test"):
        if d[key] < 1:
            raise ConfigError(f"{path}: field 'dataset.{key}' must be at least 1")
    b = data["batch_size"]
    if not 1 <= b["min"] <= b["max"]:
        raise ConfigError(f"{path}: field 'batch_size' needs 1 <= min <= max, got "
                          f"min {b['min']}, max {b['max']}")
    ev = data["evaluation"]
    cadence = [k for k in ("every_epochs", "every_steps") if ev.get(k) is not None]
    if len(cadence) != 1 or ev[cadence[0]] < 1:
        raise ConfigError(f"{path}: field 'evaluation' needs exactly one of every_epochs, "
                          f"every_steps, at least 1")
    _check_text(d, m, path)
    t = data["target"]
    if QUALITIES[t["metric"]] == "accuracy" and not 0 < t["value"] <= 1:
        raise ConfigError(f"{path}: field 'target.value' must be an accuracy in (0, 1], "
                          f"got {t['value']}")
    if not (t["value"] > 0 and math.isfinite(t["value"])):
        raise ConfigError(f"{path}: field 'target.value' must be a positive number, got "
                          f"{t['value']}")
    if (t["metric"] == "val_log_perplexity") != (d["name"] in TEXT):
        raise ConfigError(f"{path}: field 'target.metric' {t['metric']} does not fit dataset "
                          f"'{d['name']}' (val_log_perplexity for a text corpus, val_accuracy "
                          f"for images)")
    bud = data["budget"]
    if bud["max_epochs"] < 1:
        raise ConfigError(f"{path}: field 'budget.max_epochs' must be at least 1")
    if not (bud["max_seconds"] > 0 and math.isfinite(bud["max_seconds"])):
        raise ConfigError(f"{path}: field 'budget.max_seconds' must be a positive number")
    tu = data.get("tuning")  # not in level 3's schema
    for key in ("studies", "trials") if tu is not None else ():
        if tu[key] < 1:
            raise ConfigError(f"{path}: field 'tuning.{key}' must be at least 1")
    tu = tu or {"studies": 0, "trials": 0, "seed": 0}
    if data["seeds"] < 1:
        raise ConfigError(f"{path}: field 'seeds' must be at least 1")
    runs = data["seeds"] if data["seed_runs"] is None else data["seed_runs"]
    if runs < data["seeds"]:
        raise ConfigError(f"{path}: field 'seed_runs' ({runs}) must be at least 'seeds' "
                          f"({data['seeds']}): the N that score are chosen among the M run")
    rank_by = _workload.check_metrics(data, path, measured, data["level"])
    for p in PRECISIONS:
        if data[convergence.key(p)] is not None:
            convergence.parse_reference(data[convergence.key(p)], path, p)
    return Workload(
        path=path, level=data["level"], name=data["name"], description=data["description"],
        metrics=list(data["metrics"]), rank_by=rank_by, aggregate=data["aggregate"], model=m,
        dataset=d, batch_min=b["min"], batch_max=b["max"], drop_last=data["drop_last"],
        every_epochs=ev.get("every_epochs"), every_steps=ev.get("every_steps"),
        target_metric=t["metric"], target=t["value"], max_epochs=bud["max_epochs"],
        max_seconds=bud["max_seconds"], studies=tu["studies"], trials=tu["trials"],
        tuning_seed=tu["seed"], seeds=data["seeds"], seed_runs=runs,
        lowest_precision=data.get("lowest_precision") or "fp32")
