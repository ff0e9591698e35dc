"""Where results, caches and compiled artifacts go.

One directory, `$D500_HOME` (default ./d500-results)."""

from __future__ import annotations

import os
from pathlib import Path

from d500.errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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
