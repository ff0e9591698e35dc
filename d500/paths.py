"""Where results, caches and compiled artifacts go.

One directory, `$D500_HOME` (default ./d500-results)."""

from __future__ import annotations

import os
from pathlib import Path

from d500.errors import UsageError

PACKAGE = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE.parent  # a checkout's root; in an installed wheel, site-packages


def shipped(name: str) -> Path:
    """A folder d500 ships beside its code: `levels` (the rulebook), `metrics` (the scoring) or
    `submissions` (the example entries). In a checkout d500/_shipped/NAME is a symlink to the
    top-level folder; the wheel carries a copy, so an installed d500 finds them too."""
    return (PACKAGE / "_shipped" / name).resolve()


def rulebook() -> Path:
    """The rulebook: one folder per level of workload files (levels/)."""
    return shipped("levels")


def scoring() -> Path:
    """The scoring: one metric definition per file (metrics/)."""
    return shipped("metrics")


def examples() -> Path:
    """The example entries (submissions/)."""
    return shipped("submissions")


def home() -> Path:
    """The results directory, created on first use."""
    path = Path(os.environ.get("D500_HOME", "d500-results")).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"D500_HOME={path}: cannot use it as the results directory "
                         f"({err.strerror})") from None
    return path


def write_output(path: str | Path, text: str) -> Path:
    """Write a file the user asked for (--out), creating its folder; a path that cannot be
    written is a UsageError naming it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{path}: cannot write it ({err.strerror})") from None
    return path


def cache(*parts: str) -> Path:
    """A cache directory under the results directory."""
    path = home().joinpath("cache", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
