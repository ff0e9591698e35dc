"""Fixtures of level 2's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A results directory of the test's own ($D500_HOME: the ledger `Ledger()` opens)."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"
