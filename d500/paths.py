"""Where results, caches and compiled artifacts go: one directory, `$D500_HOME` (default ./d500-results)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    """The results directory, created on first use."""
    path = Path(os.environ.get("D500_HOME", "d500-results")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache(*parts: str) -> Path:
    """A cache directory under the results directory."""
    path = home().joinpath("cache", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
