"""`d500 data list|download` through `main()`, and through the `d500` dispatcher (one line and
exit 2 for every user mistake)."""

from __future__ import annotations

import json

import pytest

from d500 import cli
from d500.training import data_cli
from d500.training.data import registry

from .test_data_download import published, server  # noqa: F401 (fixtures)
from .test_data_files import adopt, make_cifar, make_idx


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("D500_DATA", raising=False)
    # `d500 data` is registered by the level-2 level module; the dispatcher is tested the same.
    monkeypatch.setitem(cli.CORE, "data", ("d500.training.data_cli", "level 2: datasets"))


def test_download_then_list(tmp_path, server, published, capsys):  # noqa: F811
    to = tmp_path / "data"
    assert data_cli.main(["download", "mnist", "--to", str(to), "--url-base", server.url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and all(line.endswith("downloaded, sha256 ok") for line in out)
    # --data DIR, as `data list` and `train` name the folder, is --to's other name (it was
    # "unrecognized arguments: --data")
    assert cli.main(["data", "download", "mnist", "--data", str(to), "--url-base",
                     server.url]) == 0
    assert all(line.endswith("already present, sha256 ok")
               for line in capsys.readouterr().out.splitlines())

    assert data_cli.main(["list", "--data", str(to), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    status = {(row["dataset"], row["file"]): row["status"] for row in table["files"]}
    assert status[("digits", "digits.csv.gz")] == "embedded"
    assert all(status[("mnist", f.name)] == "ok" for f in registry.REGISTRY["mnist"].files)
    assert status[("fashion-mnist", "train-images-idx3-ubyte.gz")] == "missing"
    assert status[("cifar10", "cifar-10-python.tar.gz")] == "missing"


def test_list_shows_bad_and_unpacked_files(tmp_path, monkeypatch, capsys):
    make_idx(tmp_path / "mnist", gz=False)
    adopt(monkeypatch, "mnist", tmp_path / "mnist")
    make_cifar(tmp_path / "cifar10")  # against the real published digest
    monkeypatch.setenv("D500_DATA", str(tmp_path))
    assert data_cli.main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["files"]
    status = {(row["dataset"], row["file"]): row["status"] for row in rows}
    assert status[("mnist", "train-images-idx3-ubyte.gz")] == "ok (unpacked)"
    assert status[("cifar10", "cifar-10-python.tar.gz")] == "bad"
    assert data_cli.main(["list"]) == 0
    assert "ok (unpacked)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["data", "download", "digits", "--to", "X"], "argument NAME: invalid choice: 'digits'"),
    (["data", "download", "mnist"], "give --to DIR (or set D500_DATA)"),
    (["data", "download", "mnist", "--to", "X", "--timeout", "0"], "--timeout: expected"),
    (["data"], "the following arguments are required: COMMAND"),
])
def test_usage_mistakes_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("d500 data: error: ") and message in err


def test_a_failed_download_is_one_line_and_exit_2(tmp_path, server, published, capsys):  # noqa: F811
    server.modes["t10k-labels-idx1-ubyte.gz"] = "wrong"
    code = cli.main(["data", "download", "mnist", "--to", str(tmp_path), "--url-base",
                     server.url])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "t10k-labels-idx1-ubyte.gz: got" in err and "not the published" in err
    assert not (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").exists()


@pytest.mark.parametrize("args", [
    ["data", "list"],
    ["train", "digits-mlp", "--submission", "sgd-momentum"],  # its data ships: never read
    ["tune", "digits-mlp", "--submission", "sgd-momentum"],
    ["reproduce", "entry.tar.gz"],
    ["reference", "digits-mlp"],
])
def test_a_data_folder_that_is_not_there_is_one_line(args, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    (tmp_path / "a-file").write_text("")
    for given, why in ((tmp_path / "typo", " (no such path)"), (tmp_path / "a-file", "")):
        assert cli.main([*args, "--data", str(given)]) == 2
        err = capsys.readouterr().err
        assert err == f"d500 {args[0]}: error: argument --data: '{given}' is not a folder{why}\n"
    assert not (tmp_path / "home" / "ledger.sqlite").exists()  # nothing ran
