"""Level-1 workload files (`levels/1-networks/*.yaml`): the schema, its checks, and the model each
names (an ONNX file in the project, a network shipped inside the onnx package, or a d500 builder).

    model:                      # exactly one of onnx_package / file / builder
      onnx_package: light_resnet50.onnx   # onnx/backend/test/data/light/ of the installed onnx
      file: models/my.onnx                # relative to the YAML file, inside the project
      builder: resnet20                   # d500.builders: mlp|lenet5|resnet20|transformer|encoder
      input_shape: [3, 32, 32]            # builder only (C, H, W)
      classes: 10                         # builder only
      context: 64                         # transformer, encoder: tokens per window (input is
      vocab: 1024                         #   int64 [batch, context]), vocabulary, and the
      layers: 2                           #   builder's options (layers, width, heads, tied)
      seed: 0                             # builder / random_weights: weight initialisation
      random_weights: true                # file / onnx_package: in-graph constant weights made
                                          # seeded random initializers (d500.networks.weights)
      loss: loss                          # file only: a scalar output to time training steps on
    batch_size: 8                         # throughput and training-step batch
    train: true                           # time training steps (needs a loss)
    seed: 0                               # input values
    budget: 2.0                           # seconds of timed repetitions per measurement
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from d500 import workload as _workload
from d500.errors import ConfigError
from d500.networks import level as _level
from d500.paths import cache
from d500.workload import COMMON, Field

LEVEL = _level.LEVEL.number
FOLDER = _level.LEVEL.rulebook()
# What `d500 net bench` measures; a workload lists a subset of these.
MEASURED = ("translate_time", "first_call_time", "compile_time", "latency", "throughput",
            "train_step_time", "agreement")

MODEL = {
    "onnx_package": Field(str, help="a model file inside onnx/backend/test/data/light/"),
    "file": Field("path", help="an ONNX file, relative to the workload file"),
    "builder": Field(str, help="a d500 builder: mlp, lenet5, resnet20, transformer, encoder"),
    "input_shape": Field(list, items=int, help="builder: (C, H, W)"),
    "classes": Field(int, help="builder: number of classes (default 10)"),
    "seed": Field(int, help="builder, random_weights: seed of the weights (default 0)"),
    "random_weights": Field(bool, default=False,
                            help="file/onnx_package: replace in-graph constant weights by seeded "
                                 "random initializers"),
    "loss": Field(str, help="file/onnx_package: the scalar output training steps differentiate"),
    "context": Field(int, help="transformer: tokens per window"),
    "vocab": Field(int, help="transformer: vocabulary size"),
    "layers": Field(int, help="transformer: layers"),
    "width": Field(int, help="transformer: width"),
    "heads": Field(int, help="transformer: attention heads"),
    "tied": Field(bool, help="transformer: output projection tied to the token embedding"),
}
LM_FIELDS = ("context", "vocab", "layers", "width", "heads", "tied")

SCHEMA = {
    **COMMON,
    "level": _workload.level_field(LEVEL),
    "model": Field(MODEL, required=True),
    "batch_size": Field(int, default=1),
    "train": Field(bool, default=False),
    "seed": Field(int, default=0),
    "budget": Field(float, default=2.0),
}


@dataclass
class Workload:
    """A validated level-1 workload."""

    path: Path
    name: str
    description: str
    metrics: list[str]
    rank_by: str
    aggregate: str
    model: dict[str, Any]
    batch_size: int
    train: bool
    seed: int
    budget: float

    @property
    def loss_output(self) -> str | None:
        if self.model.get("builder"):
            return "loss"
        return self.model.get("loss")

    def model_label(self) -> str:
        m = self.model
        if _language(m):
            return f"builder {m['builder']} (context {m['context']}, vocab {m['vocab']})"
        if m.get("builder"):
            return f"builder {m['builder']} {tuple(m['input_shape'])}"
        source = (f"onnx package {m['onnx_package']}" if m.get("onnx_package")
                  else str(m["file"]))
        return source + (f", random weights (seed {m['seed']})" if m.get("random_weights")
                         else "")

    def onnx_model(self, *, loss: bool = False) -> tuple[onnx.ModelProto, Path]:
        """The model (with its loss for `loss=True`) and a file holding it (a builder's model is
        written once under the cache, so the ledger can hash it)."""
        m = self.model
        if _language(m):
            from d500 import builders
            options = {k: m[k] for k in LM_FIELDS[2:] if m.get(k) is not None}
            proto = builders.build_lm(m["builder"], m["context"], m["vocab"], m["seed"],
                                      loss=loss, **options)
            return proto, cached_model(proto, m["builder"])
        if m.get("builder"):
            from d500 import builders
            proto = builders.build(m["builder"], tuple(m["input_shape"]), m["classes"],
                                   m["seed"], loss=loss)
            return proto, cached_model(proto, m["builder"])
        path = Path(m["file"]) if m.get("file") else onnx_package_file(m["onnx_package"],
                                                                         self.path)
        from d500.model import load
        proto = load(path)
        if m.get("random_weights"):
            from d500.networks.weights import randomize
            proto, _ = randomize(proto, m["seed"])
            return proto, cached_model(proto, f"{path.stem}-random{m['seed']}")
        return proto, path


def _language(m: dict[str, Any]) -> bool:
    """Whether the model fields name a language-model builder (d500.builders.LANGUAGE)."""
    from d500.builders import LANGUAGE
    return m.get("builder") in LANGUAGE


def cached_model(proto: onnx.ModelProto, stem: str) -> Path:
    """A generated model written once under the cache (by content), so the ledger can hash it."""
    data = proto.SerializeToString(deterministic=True)
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = cache("models") / f"{stem}-{digest}.onnx"
    if not path.is_file():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def light_folder() -> Path:
    """onnx/backend/test/data/light of the installed onnx package."""
    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"


def onnx_package_models() -> list[str]:
    return sorted(p.name for p in light_folder().glob("*.onnx"))


def onnx_package_file(name: str, where: Path | str = "model.onnx_package") -> Path:
    """The file `name` in the onnx package's light models; an unknown name is a ConfigError."""
    folder = light_folder()
    candidate = (folder / name).resolve()
    if "/" in name or "\\" in name or not candidate.is_file() or candidate.parent != folder:
        raise ConfigError(f"{where}: field 'model.onnx_package' is {name!r}, not a model shipped "
                          f"in the onnx package (choose from {', '.join(onnx_package_models())})")
    return candidate


def load(path: str | Path) -> Workload:
    """Read and check a level-1 workload file; every problem is a ConfigError naming the field."""
    path = Path(path)
    data = _workload.load(path, SCHEMA)
    m = data["model"]
    source = _workload.model_source(m, path, ("onnx_package", "file", "builder"))
    if source == "builder" and _language(m):
        _check_language(m, path)
    elif source == "builder":
        for key in LM_FIELDS:
            if m.get(key) is not None:
                raise ConfigError(f"{path}: field 'model.{key}' only applies to a "
                                  f"language-model builder (transformer, encoder)")
        shape = m.get("input_shape") or [1, 28, 28]
        if len(shape) != 3 or any(d < 1 for d in shape):
            raise ConfigError(f"{path}: field 'model.input_shape' must be [C, H, W] with "
                              f"positive sizes, got {shape}")
        m["input_shape"] = shape
        m["classes"] = 10 if m.get("classes") is None else m["classes"]
        m["seed"] = 0 if m.get("seed") is None else m["seed"]
        if m["classes"] < 2:
            raise ConfigError(f"{path}: field 'model.classes' must be at least 2")
        if m.get("loss") is not None:
            raise ConfigError(f"{path}: field 'model.loss' is for file models; a builder's loss "
                              f"output is 'loss'")
        if m.get("random_weights"):
            raise ConfigError(f"{path}: field 'model.random_weights' is for file and "
                              f"onnx_package models; a builder's weights are random already")
    else:
        for key in ("input_shape", "classes", *LM_FIELDS):
            if m.get(key) is not None:
                raise ConfigError(f"{path}: field 'model.{key}' only applies to model.builder")
        if m.get("seed") is not None and not m.get("random_weights"):
            raise ConfigError(f"{path}: field 'model.seed' needs model.builder or "
                              f"model.random_weights")
        m["seed"] = 0 if m.get("seed") is None else m["seed"]
        if m.get("onnx_package") is not None:
            onnx_package_file(m["onnx_package"], path)
    if data["batch_size"] < 1:
        raise ConfigError(f"{path}: field 'batch_size' must be at least 1")
    for where, seed in (("seed", data["seed"]), ("model.seed", m["seed"])):
        if seed < 0:
            raise ConfigError(f"{path}: field '{where}' must be an integer >= 0, got {seed}")
    if not (data["budget"] > 0 and math.isfinite(data["budget"])):
        raise ConfigError(f"{path}: field 'budget' must be a positive number of seconds")
    names = data["metrics"]
    rank_by = _workload.check_metrics(data, path, MEASURED, LEVEL)
    has_loss = m.get("builder") is not None or m.get("loss") is not None
    if data["train"] and not has_loss:
        raise ConfigError(f"{path}: field 'train' is true but the model has no loss (use "
                          f"model.builder, or name a scalar output in model.loss)")
    if "train_step_time" in names and not data["train"]:
        raise ConfigError(f"{path}: field 'metrics' names train_step_time but 'train' is false")
    return Workload(path=path, name=data["name"], description=data["description"],
                    metrics=list(names), rank_by=rank_by, aggregate=data["aggregate"], model=m,
                    batch_size=data["batch_size"], train=data["train"], seed=data["seed"],
                    budget=data["budget"])


def find(name_or_path: str) -> Path:
    """A workload by file path or by name (the `name:` field or file stem in levels/1-networks)."""
    return _workload.find(name_or_path, FOLDER, LEVEL)


def all_files() -> list[Path]:
    return sorted(FOLDER.glob("*.yaml"))


def _check_language(m: dict[str, Any], path: Path) -> None:
    """A language-model builder's fields: context and vocab given, no image fields."""
    for key in ("input_shape", "classes"):
        if m.get(key) is not None:
            raise ConfigError(f"{path}: field 'model.{key}' is for image builders; "
                              f"{m['builder']} takes model.context and model.vocab")
    for key in ("context", "vocab"):
        if m.get(key) is None or m[key] < (2 if key == "vocab" else 1):
            raise ConfigError(f"{path}: field 'model.{key}' is required for builder "
                              f"{m['builder']} (a positive integer)")
    m["seed"] = 0 if m.get("seed") is None else m["seed"]
