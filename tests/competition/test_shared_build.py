"""The guard on the competition tests' shared build (conftest.py): a worker that finds the rules,
the entry or the trained home changed at its end fails; bytecode an import writes does not count."""

from __future__ import annotations

from tests.competition.conftest import _digest


def test_a_changed_shared_build_is_caught_and_bytecode_is_not(tmp_path):
    (tmp_path / "home" / "runs").mkdir(parents=True)
    ledger = tmp_path / "home" / "ledger.sqlite"
    ledger.write_bytes(b"runs 1-6")
    sha = _digest(tmp_path)
    (tmp_path / "sha256").write_text(sha)  # the digest's own file is left out of it
    (tmp_path / "entry" / "__pycache__").mkdir(parents=True)
    (tmp_path / "entry" / "__pycache__" / "guarded.cpython-311.pyc").write_bytes(b"\0")
    assert _digest(tmp_path) == sha
    ledger.write_bytes(b"runs 1-7")
    assert _digest(tmp_path) != sha
    ledger.write_bytes(b"runs 1-6")
    (tmp_path / "home" / "runs" / "7.txt").write_text("")  # an added file, even empty
    assert _digest(tmp_path) != sha
