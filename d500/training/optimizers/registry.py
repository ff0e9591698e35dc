"""The framework-neutral optimizers by name, `make(name, **hp)`, and `load_optimizer` for a
submission's own Optimizer subclass in a Python file."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from d500.backends import import_user_file
from d500.errors import ConfigError
from d500.training.optimizers.adagrad import Adagrad
from d500.training.optimizers.adam import Adam, AdamW
from d500.training.optimizers.base import Hyper, Optimizer, check_value
from d500.training.optimizers.lamb import LAMB
from d500.training.optimizers.lars import LARS
from d500.training.optimizers.sgd import SGD, Momentum, Nesterov

OPTIMIZERS: dict[str, type[Optimizer]] = {
    cls.name: cls for cls in (SGD, Momentum, Nesterov, Adam, AdamW, LARS, LAMB, Adagrad)}


def make(name: str, **hp: Any) -> Optimizer:
    """The framework-neutral optimizer `name` with hyperparameters `hp` (validated now: a bad
    value or an unknown name is a ConfigError naming it)."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer '{name}' (known: {', '.join(OPTIMIZERS)})")
    return OPTIMIZERS[name](**hp)


def load_optimizer(file: str | Path, class_name: str) -> type[Optimizer]:
    """The Optimizer subclass `class_name` defined in the Python file `file` (imported from its
    path); every problem is a ConfigError naming the file."""
    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"{path}: optimizer file not found")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    try:
        module = import_user_file(path, f"d500_submission_{path.stem}_{digest}")
    except SyntaxError as err:
        raise ConfigError(f"{path}:{err.lineno}: syntax error: {err.msg}") from err
    except Exception as err:  # the submission's import failed: say where
        raise ConfigError(f"{path}: importing it failed: {type(err).__name__}: {err}") from err
    if module is None:
        raise ConfigError(f"{path}: not a Python file that can be imported")
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"{path}: no class '{class_name}' in the file")
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise ConfigError(f"{path}: '{class_name}' is not a subclass of "
                          "d500.training.optimizers.Optimizer")
    if cls.update is Optimizer.update:
        raise ConfigError(f"{path}: class '{class_name}' does not define update()")
    _check_declaration(path, class_name, cls)
    return cls


def _check_declaration(path: Path, class_name: str, cls: type[Optimizer]) -> None:
    """The class's hyperparameters table is well formed and its defaults pass their own kinds."""
    table = getattr(cls, "hyperparameters", None)
    if not isinstance(table, dict) or "lr" not in table:
        raise ConfigError(f"{path}: {class_name}.hyperparameters must be a dict that includes "
                          "'lr' (extend Optimizer.hyperparameters)")
    for key, hyper in table.items():
        if not isinstance(hyper, Hyper):
            raise ConfigError(f"{path}: {class_name}.hyperparameters['{key}'] is not a Hyper")
        if hasattr(Optimizer, key):
            raise ConfigError(f"{path}: {class_name}: hyperparameter '{key}' would hide "
                              f"Optimizer.{key}")
        check_value(f"{path}: {class_name}", key, hyper, hyper.default)
