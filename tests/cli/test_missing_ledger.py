"""A command that only reads the ledger refuses one that is not there, in one line naming the
path and where it came from (--ledger, $D500_HOME or the default home), exit 2, creating
nothing: a mistyped D500_HOME or --ledger made an empty home and ledger, and an empty board
said nothing of the typo. A command that records runs still creates them."""

from __future__ import annotations

import json

import pytest

from d500 import cli

# every command that reads the ledger and records nothing: the ledger's own, the board, an
# entry's package (written elsewhere, from the ledger's runs), the scaling model of a run
READERS = [["ledger", "list"], ["ledger", "list", "--json"], ["ledger", "show", "last"],
           ["ledger", "show", "1"], ["ledger", "verify"], ["ledger", "export"],
           ["leaderboard"], ["leaderboard", "--format", "terminal"],
           ["leaderboard", "--format", "html"], ["package", "sgd-momentum", "--out", "x.tar.gz"],
           ["scale", "1", "--network", "2us,12.5GB/s"]]


def with_ledger(args: list[str], path: str) -> list[str]:
    """`args` with `--ledger path` where the command takes it (`d500 ledger`: before its
    subcommand)."""
    if args[0] == "ledger":
        return ["ledger", "--ledger", path, *args[1:]]
    return [*args, "--ledger", path]


def refused(args: list[str], capsys, folder) -> str:
    """The one line `d500 ARGS` says, run in `folder`, after checking that it exits 2, prints
    nothing else and creates nothing there."""
    before = sorted(folder.rglob("*"))
    capsys.readouterr()
    code = cli.main(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert "Traceback" not in err
    assert sorted(folder.rglob("*")) == before, "a reader created files"
    return err


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_reader_refuses_a_d500_home_that_does_not_exist(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("D500_HOME", str(tmp_path / "reslts"))  # the typo of ./results
    err = refused(args, capsys, tmp_path)
    assert err == (f"d500 {args[0]}: error: no ledger at {tmp_path}/reslts/ledger.sqlite: "
                   f"$D500_HOME={tmp_path}/reslts does not exist; check the path, or record "
                   f"runs first (d500 run, d500 train, d500 op bench ...)\n")


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_reader_refuses_a_ledger_file_that_does_not_exist(args, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    err = refused(with_ledger(args, "resluts/ledger.sqlite"), capsys, tmp_path)
    assert err == (f"d500 {args[0]}: error: --ledger resluts/ledger.sqlite: no such ledger file "
                   f"in {tmp_path}\n")


@pytest.mark.parametrize("args", [["ledger", "list"], ["leaderboard"]], ids=" ".join)
def test_the_default_home_and_an_empty_one_are_named_so(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("D500_HOME", raising=False)
    err = refused(args, capsys, tmp_path)
    assert ": the default home ./d500-results ($D500_HOME is unset) does not exist; " in err
    (tmp_path / "d500-results").mkdir()
    monkeypatch.setenv("D500_HOME", "")
    err = refused(args, capsys, tmp_path)
    assert err.startswith(f"d500 {args[0]}: error: no ledger at {tmp_path}/d500-results/"
                          f"ledger.sqlite: the default home ./d500-results ($D500_HOME is "
                          f"empty) has no ledger.sqlite yet; "), err


def test_a_folder_given_as_the_ledger_is_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    err = refused(["leaderboard", "--ledger", str(tmp_path)], capsys, tmp_path)
    assert err.endswith(f"--ledger {tmp_path}: is a folder, not a ledger file\n")


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_an_empty_file_given_as_the_ledger_is_refused_untouched(args, tmp_path, monkeypatch,
                                                               capsys):
    """`--ledger notes` naming an empty file: SQLite took it for an empty database, and the
    reader wrote d500's tables into it (114,688 bytes) and showed an empty ledger."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    (tmp_path / "notes").write_bytes(b"")
    err = refused(with_ledger(args, "notes"), capsys, tmp_path)
    assert err == (f"d500 {args[0]}: error: --ledger notes: an empty file, not a ledger (d500 "
                   f"writes its ledgers as $D500_HOME/ledger.sqlite)\n")
    assert (tmp_path / "notes").stat().st_size == 0


def test_a_home_that_is_a_file_is_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").write_text("")
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    err = refused(["ledger", "verify"], capsys, tmp_path)
    assert err == (f"d500 ledger: error: $D500_HOME={tmp_path}/home: is a file, not a results "
                   f"directory (no ledger to read)\n")


OPERATOR = '''import numpy as np
from d500.operators import CustomOperator


class MyRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.maximum(x, 0)
'''


def test_a_writer_still_creates_the_home_and_its_ledger(tmp_path, monkeypatch, capsys):
    """`d500 op validate` records its run: a home that is not there yet is made, and then the
    readers read it."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "new" / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    (tmp_path / "my_op.py").write_text(OPERATOR)
    assert cli.main(["op", "validate", "my_op.py:MyRelu", "--input-shape", "4,4"]) == 0
    assert (home / "ledger.sqlite").is_file()
    capsys.readouterr()
    assert cli.main(["ledger", "list", "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert run["submission"] == "MyRelu" and run["status"] == "succeeded"
    assert cli.main(["ledger", "--ledger", str(home / "ledger.sqlite"), "verify"]) == 0
