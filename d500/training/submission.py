"""Level-2 submissions (`submission.yaml`): the workloads an entry enters, its default recipe and
its search space for tuning; trials drawn quasi-randomly (scrambled Halton, scipy.stats.qmc).

    name: sgd-momentum
    level: 2
    workloads: [digits-mlp, digits-lenet]
    optimizer: momentum            # a built-in (d500.training.optimizers) or FILE.py:Class
    native: false                  # true: the framework's own optimizer (torch.optim, Keras)
    precision: fp32                # fp32 | bf16 | fp16: what the linear layers compute in
    batch_size: 32
    hyperparameters: {lr: 0.05, momentum: 0.9}
    schedule: {name: cosine, warmup: 0.05}
    # or a constant lr and a growing batch (d500.training.batch_schedule):
    # batch_schedule: {growth: 2, every_epochs: 2, max: 256}
    search_space:                  # keys: optimizer hyperparameters, batch_size, schedule.<p>
      lr: {min: 0.01, max: 0.5, scale: log}
      momentum: {min: 0.8, max: 0.95}
      batch_size: {values: [16, 32, 64]}
    # or feasible_points: [{lr: 0.1}, {lr: 0.05}]   (tried in order)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, listed
from d500.training.precision import PRECISIONS
from d500.training.recipe import Recipe
from d500.workload import Field
from d500.workload import load as load_yaml

SCHEMA = {
    "name": Field(str, required=True, help="the entry's name, as it shows on the leaderboard"),
    "level": Field(int, required=True, choices=(2, 3)),
    "description": Field(str, default=""),
    "authors": Field(list, default=[], items=str),
    "workloads": Field(list, required=True, items=str, help="the workload names it enters"),
    "optimizer": Field(str, required=True),
    "native": Field(bool, default=False),
    "precision": Field(str, default="fp32", choices=PRECISIONS),
    "batch_size": Field(int, required=True),
    "hyperparameters": Field(dict, default={}),
    "schedule": Field(dict, default={"name": "constant"}),
    "batch_schedule": Field(dict, help="grow the batch by epochs in place of a decaying lr "
                                       "(d500.training.batch_schedule)"),
    "search_space": Field(dict, default={}),
    "feasible_points": Field(list, default=[]),
    "distributed": Field(dict, default={}, help="level 3: the scheme and its options"),
}
SCALES = ("linear", "log")


@dataclass
class Submission:
    """A validated level-2 (or level-3) entry."""

    path: Path
    name: str
    level: int
    workloads: list[str]
    recipe: Recipe
    search_space: dict[str, dict[str, Any]] = field(default_factory=dict)
    feasible_points: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    distributed: dict[str, Any] = field(default_factory=dict)

    def recipe_with(self, params: dict[str, Any]) -> Recipe:
        """The default recipe with a trial's parameters put in."""
        hp = dict(self.recipe.hyperparameters)
        schedule = dict(self.recipe.schedule_spec)
        batch, low = self.recipe.batch_size, self.recipe.precision
        for key, value in params.items():
            if key == "batch_size":
                batch = int(value)
            elif key == "precision":  # a run's own (d500 train --precision), when reproduced
                low = str(value)
            elif key.startswith("schedule."):
                schedule[key.split(".", 1)[1]] = value
            else:
                hp[key] = value
        return Recipe(self.recipe.optimizer_name, hp, schedule, batch, self.recipe.native,
                      self.recipe.entry, where=str(self.path), precision=low,
                      batch_schedule=self.recipe.batch_schedule)

    def validate(self, points: list[dict[str, Any]]) -> None:
        """Every point's recipe has valid optimizer hyperparameters (an entry's own optimizer:
        all of them probed in one child process); a ConfigError names the first bad one."""
        recipes = [self.recipe_with(p) for p in points]
        if self.recipe.entry is not None:
            self.recipe.entry.probe([r.hyperparameters for r in recipes])
        for recipe in recipes:
            recipe.hp()

    def check_tunable(self, count: int) -> None:
        """`count` trial points can be drawn: as many feasible points, or a search space (a
        ConfigError naming the file; cheap, so `d500 tune` says it before a framework loads)."""
        if self.feasible_points:
            if count > len(self.feasible_points):
                raise ConfigError(f"{self.path}: {count} trials asked, but only "
                                  f"{len(self.feasible_points)} feasible_points given")
        elif not self.search_space:
            raise ConfigError(f"{self.path}: tuning needs a 'search_space' or "
                              f"'feasible_points'")

    def trials(self, count: int, seed: int) -> list[dict[str, Any]]:
        """The first `count` trial points of a study seeded by `seed`: the feasible points in
        order, or scrambled-Halton draws from the search space (the same for the same seed)."""
        self.check_tunable(count)
        if self.feasible_points:
            return [dict(p) for p in self.feasible_points[:count]]
        from scipy.stats import qmc
        keys = sorted(self.search_space)
        points = qmc.Halton(d=len(keys), scramble=True, seed=seed).random(count)
        return [{k: _map(self.search_space[k], float(u)) for k, u in zip(keys, row)}
                for row in points]


def _map(space: dict[str, Any], u: float) -> Any:
    """A unit-interval draw mapped onto one dimension of the search space."""
    if "values" in space:
        values = space["values"]
        return values[min(int(u * len(values)), len(values) - 1)]
    lo, hi = space["min"], space["max"]
    if space.get("scale", "linear") == "log":
        value = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    else:
        value = lo + u * (hi - lo)
    return int(round(value)) if space.get("integer") else value


def by_name(missing: Path) -> str:
    """For a relative entry path that is not there (`submissions/sgd-momentum` typed outside a
    checkout): ' in CWD; d500's example entry 'sgd-momentum' is found by its name: give
    sgd-momentum', where an example entry has its name; '' otherwise."""
    from d500.paths import examples
    name = missing.parent.name if missing.name == "submission.yaml" else missing.name
    if missing.is_absolute() or not (examples() / name / "submission.yaml").is_file():
        return ""
    return f" in {Path.cwd()}; d500's example entry '{name}' is found by its name: give {name}"


# files given as --submission that no submission.yaml is: Python (the entry's optimizer), a model,
# arrays, a package (d500 package --out)
NOT_ENTRIES = (".py", ".onnx", ".npz", ".gz", ".tgz")


def load(path: str | Path) -> Submission:
    """Read and validate a submission folder or its submission.yaml."""
    given, path = str(path), Path(path)
    if not path.exists():
        from d500.paths import looked_in
        raise ConfigError(f"{given}: no such entry (a folder holding submission.yaml, or that "
                          f"file){by_name(path) or looked_in(path)}")
    if path.is_file() and path.suffix.lower() in NOT_ENTRIES:  # my_opt.py: its YAML error
        raise ConfigError(f"{given}: not an entry (a folder holding submission.yaml, or that "
                          f"file)" + (f"; its optimizer file is named there: optimizer: "
                                      f"{path.name}:Class" if path.suffix == ".py" else ""))
    if path.is_dir():
        path = path / "submission.yaml"
    data = load_yaml(path, SCHEMA)
    where = str(path)
    files = [path.resolve()]
    entry = None
    name = data["optimizer"]
    if ":" in name:
        from d500.training.entry import EntryOptimizer
        file, _, cls = name.rpartition(":")
        source = (path.parent / file).resolve()
        if not source.is_relative_to(path.parent.resolve()):
            raise ConfigError(f"{path}: field 'optimizer' points outside the submission folder")
        entry = EntryOptimizer(source, cls)
        files.append(source)
    else:
        from d500.training.optimizers import OPTIMIZERS
        if name not in OPTIMIZERS:
            from d500.errors import did_you_mean
            hint = did_you_mean(name, OPTIMIZERS)
            raise ConfigError(f"{path}: field 'optimizer' is '{name}'; known: "
                              f"{', '.join(OPTIMIZERS)}, or FILE.py:Class"
                              f"{'; ' + hint if hint else ''}")
    schedule = data["schedule"]
    if "name" not in schedule:
        schedule = {"name": "constant", **schedule}
    points = data["feasible_points"]
    if entry is not None:  # the file imported and the default checked in a child process
        entry.probe([dict(data["hyperparameters"])])
        name = entry.name
    recipe = Recipe(name, dict(data["hyperparameters"]), dict(schedule), data["batch_size"],
                    data["native"], entry, where=where, precision=data["precision"],
                    batch_schedule=data["batch_schedule"])
    recipe.hp()
    recipe.make_schedule()
    recipe.growth()
    space = {k: _check_dimension(path, k, v, recipe) for k, v in data["search_space"].items()}
    for i, point in enumerate(points):
        if not isinstance(point, dict) or not point:
            raise ConfigError(f"{path}: field 'feasible_points[{i}]' must be a mapping of "
                              f"hyperparameters")
    sub = Submission(path, data["name"], data["level"], list(data["workloads"]), recipe, space,
                     [dict(p) for p in points], files, dict(data["distributed"]))
    sub.validate([*points] or ([_corner(space, 0.0), _corner(space, 1.0)] if space else []))
    return sub  # every feasible point, or every corner of the space, is valid


def _corner(space: dict[str, dict[str, Any]], u: float) -> dict[str, Any]:
    return {k: _map(v, u if "values" not in v else 0.0) for k, v in space.items()}


def _check_dimension(path: Path, key: str, dim: Any, recipe: Recipe) -> dict[str, Any]:
    where = f"{path}: field 'search_space.{key}'"
    hp_names = set(recipe.hp())
    if key != "batch_size" and not key.startswith("schedule.") and key not in hp_names:
        raise ConfigError(f"{where}: '{key}' is not a hyperparameter of optimizer "
                          f"'{recipe.optimizer_name}' (known: {', '.join(sorted(hp_names))}), "
                          f"batch_size or schedule.<parameter>")
    if not isinstance(dim, dict):
        raise ConfigError(f"{where} must be a mapping: {{min, max, scale}} or {{values: [...]}}")
    if "values" in dim:
        if set(dim) != {"values"} or not isinstance(dim["values"], list) or not dim["values"]:
            raise ConfigError(f"{where}: 'values' must be a non-empty list and alone")
        return dict(dim)
    unknown = set(dim) - {"min", "max", "scale", "integer"}
    if unknown:
        first = sorted(unknown)[0]
        raise ConfigError(f"{where}: unknown key '{first}' (allowed: "
                          f"{listed(first, ['min', 'max', 'scale', 'integer', 'values'])})")
    lo, hi = dim.get("min"), dim.get("max")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (lo, hi))
    if not numbers or not lo < hi:
        raise ConfigError(f"{where}: needs numbers min < max, got min {lo!r}, max {hi!r}")
    scale = dim.get("scale", "linear")
    if scale not in SCALES:
        raise ConfigError(f"{where}: scale '{scale}' is not one of {', '.join(SCALES)}")
    if scale == "log" and lo <= 0:
        raise ConfigError(f"{where}: a log scale needs min > 0, got {lo}")
    out = {"min": float(lo), "max": float(hi), "scale": scale,
           "integer": bool(dim.get("integer", key == "batch_size"))}
    return out
