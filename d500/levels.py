"""The level plug-in contract and its registry: what every level package offers the runner, the
CLI and the leaderboard, which iterate the registered levels and know nothing of any one.

A level is a package with a `level` module that defines `LEVEL`, an instance of a `Level`
subclass. Adding a level is adding that package and one line to `REGISTERED`. A level module
imports only the standard library and this module at import time (the CLI reads the levels'
commands for `d500 --help`, which must stay instant); everything else is imported inside methods.

    class MyLevel(Level):
        number, name, folder = 4, "serving", "4-serving"
        commands = {"serve": Command("d500.serving.cli", "level 4: ...")}
        def load(self, path): ...            # validated workload (ConfigError naming the field)
        def plan(self, options): ...          # list[Item] for `d500 run`
        def execute(self, item, context): ... # runs it, records its own ledger runs -> Outcome
    LEVEL = MyLevel()
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from d500.errors import ConfigError

# One line per level: the module that defines LEVEL.
REGISTERED: list[str] = [
    "d500.operators.level",
    "d500.networks.level",
    "d500.training.level",
    "d500.distributed.level",
]


@dataclass(frozen=True)
class Command:
    """A CLI subcommand a level adds: the module whose `main(argv, prog) -> int` runs it."""

    module: str
    help: str


@dataclass
class RunOptions:
    """What `d500 run` asks of every level's plan."""

    workloads: list[str] = field(default_factory=list)  # only these names (empty: the default)
    backends: list[str] | None = None  # None: every installed backend
    budget: float = 0.5  # seconds of timing per measurement
    quick: bool = False  # the shortest suite


@dataclass
class Item:
    """One planned unit of `d500 run`: a label for the progress bar, the workload names whose
    leaderboard boards it fills, and whatever the level needs to execute it."""

    label: str
    workloads: list[str]
    payload: Any = None
    requested: list[str] = field(default_factory=list)  # the --workload strings it answers


@dataclass
class Context:
    """What an executing item gets: the ledger, a progress note, a log file for long output."""

    ledger: Any
    note: Callable[[str], None] = lambda text: None
    log: Callable[[str], None] = lambda text: None
    options: RunOptions = field(default_factory=RunOptions)


@dataclass
class Outcome:
    """What an executed item reports: one line per problem (recorded as failed runs in the
    ledger too) and one summary line for the console."""

    problems: list[str] = field(default_factory=list)
    summary: str = ""


@dataclass
class View:
    """A section a level adds to its part of the leaderboard: a table of text cells, plots
    (caption, PNG bytes) and notes. Every renderer (terminal, Markdown, HTML) shows it."""

    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    plots: list[tuple[str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Level:
    """The interface every level implements (see the module docstring)."""

    number: int
    name: str  # "operators", "networks", ...
    folder: str  # its folder in the rulebook, e.g. "0-operators"
    noun: str = "workload"  # what its workloads are called (level 0's: cases, as `--case` says)
    commands: ClassVar[dict[str, Command]] = {}

    @property
    def title(self) -> str:
        return f"level {self.number}: {self.name}"

    # -- workloads -------------------------------------------------------------------------
    def rulebook(self) -> Path:
        """The folder of this level's workload files in the rulebook."""
        from d500.paths import rulebook
        return rulebook() / self.folder

    def workload_files(self) -> list[Path]:
        return sorted(self.rulebook().glob("*.yaml"))

    def load(self, path: str | Path) -> Any:
        """Read and validate one workload file; a problem is a ConfigError naming the field."""
        raise NotImplementedError

    def find(self, name_or_path: str) -> Path:
        """A workload file by path, file stem or `name:` in this level's rulebook folder."""
        from d500.workload import find
        return find(name_or_path, self.rulebook(), self.number, self.noun)

    def entries(self) -> list[Path]:
        """The example submission folders (submissions/) whose `level:` is this level."""
        from d500.paths import examples
        from d500.workload import read_yaml
        found = []
        for file in sorted(examples().glob("*/submission.yaml")):
            _, data = read_yaml(file)
            if isinstance(data, dict) and data.get("level") == self.number:
                found.append(file.parent)
        return found

    # -- d500 run --------------------------------------------------------------------------
    def plan(self, options: RunOptions) -> list[Item]:
        """The items of `d500 run` (only those touching `options.workloads`, when given)."""
        raise NotImplementedError

    def execute(self, item: Item, context: Context) -> Outcome:
        """Run one item through the level's library, which opens, fills and seals its own
        ledger runs."""
        raise NotImplementedError

    # -- leaderboard -----------------------------------------------------------------------
    def views(self, boards: Sequence[Any], ledger: Any) -> list[View]:
        """Sections shown above this level's boards (e.g. a summary over its workloads)."""
        return []


def all_levels() -> list[Level]:
    """Every registered level, in level order."""
    found = [importlib.import_module(module).LEVEL for module in REGISTERED]
    return sorted(found, key=lambda level: level.number)


def get(number: int) -> Level:
    """The registered level with this number; an unknown one is a ConfigError."""
    for level in all_levels():
        if level.number == number:
            return level
    known = ", ".join(str(level.number) for level in all_levels())
    raise ConfigError(f"level {number} is not registered (registered: {known})")


def of_file(path: str | Path, takes: Sequence[int] | None = None) -> Level:
    """The level a workload file declares in its `level:` field (one of `takes`, when given: a
    file of another level is said so)."""
    from d500.workload import other_level, read_yaml
    path, data = read_yaml(path)
    number = data.get("level") if isinstance(data, dict) else None
    if not isinstance(number, int) or isinstance(number, bool):
        raise ConfigError(f"{path}: missing required field 'level'")
    if takes is not None and number not in takes:
        raise other_level(path, number, takes)
    return get(number)
