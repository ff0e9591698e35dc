"""Mistakes said before the slow work starts: a missing dataset or a bad --seeds before a
framework loads, an output path that is a folder before the board or plot is made, a folder or
an empty file where a file goes, a results folder that cannot be written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_cli import d500, one_line_exit_2

MNIST = "dataset 'mnist' is read from files: give --data DIR"


@pytest.mark.parametrize("args, words", [
    (["train", "mnist-lenet", "--submission", "sgd-momentum", "--seed", "1"], MNIST),
    (["tune", "mnist-lenet", "--submission", "sgd-momentum"], MNIST),
    (["reference", "mnist-lenet"], MNIST),
    (["train", "digits-mlp", "--submission", "sgd-momentum", "--seeds", "5"],
     "--seeds must be 1 to 3: workload 'digits-mlp' requires 3 seed run(s)"),
    (["train", "digits-mlp", "--submission", "sgd-momentum", "--seeds", "1", "--seed", "3"],
     "give --seed or --seeds, not both"),
    (["train", "digits-mlp", "--submission", "sgd-momentum", "--resume", "7"],
     "no run 7 in the ledger"),
    (["train", "digits-mlp", "--submission", "sgd-momentum", "--seed", "0"],
     "seed 0 was already used by run 1 of this entry; pass --repeat to measure it again"),
    (["run", "--workload", "mlp-mnst", "--backends", "torch"], "(did you mean 'mlp-mnist'?)"),
    (["reference", "digits-mlp", "--at", "mom=1"], "unknown hyperparameter 'mom'"),
    (["reference", "digits-mlp", "--at", "lr=x"],  # the option named, not the entry's file
     "d500 reference: error: --at lr=x: optimizer 'momentum': hyperparameter 'lr' must be"),
    (["reference", "digits-mlp", "--trials", "no-such.tar.gz"],
     "no-such.tar.gz: no such package file"),
    (["tune", "digits-mlp", "--submission", "{entry}"],
     "submission.yaml: tuning needs a 'search_space' or 'feasible_points'"),
    (["tune", "digits-mlp", "--submission", "{points}", "--trials", "3"],
     "submission.yaml: 3 trials asked, but only 2 feasible_points given")])
def test_a_mistake_is_said_before_a_framework_loads(args, words, tmp_path):
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules])")
    entry = "name: e\nlevel: 2\nworkloads: [digits-mlp]\noptimizer: sgd\nbatch_size: 32\n"
    for name, extra in (("entry", ""), ("points", "feasible_points: [{lr: 0.1}, {lr: 0.2}]\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "submission.yaml").write_text(entry + extra)
    args = [a.format(entry=tmp_path / "entry", points=tmp_path / "points") for a in args]
    if "--seed" in args:  # a run of seed 0 recorded before
        from d500.ledger import Ledger
        from d500.training.submission import load
        entry = load(os.path.join(os.path.dirname(__file__), "..", "submissions", "sgd-momentum"))
        Ledger(tmp_path / "ledger.sqlite").start_run(
            level=2, workload="digits-mlp", submission=entry.name, backend="torch", seed=0,
            hyperparameters=entry.recipe.hyperparameters_logged()).finish("failed")
    env = {k: v for k, v in os.environ.items() if k != "D500_DATA"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**env, "D500_HOME": str(tmp_path)}, check=False)
    assert out.stdout.strip() == "2 []", (out.stdout, out.stderr)
    assert words in out.stderr, out.stderr


def test_a_data_folder_from_d500_data_that_is_not_there_names_d500_data(tmp_path):
    env = {**os.environ, "D500_HOME": str(tmp_path), "D500_DATA": str(tmp_path / "nowhere")}
    for args in (["data", "list"], ["train", "mnist-lenet", "--submission", "sgd-momentum"]):
        one_line_exit_2(d500(*args, env=env), f"D500_DATA={tmp_path / 'nowhere'}: the data "
                        "directory does not exist")
    (tmp_path / "a-file").write_text("")  # there, but a file: 'does not exist' said of it
    env["D500_DATA"] = str(tmp_path / "a-file")
    one_line_exit_2(d500("data", "list", env=env),
                    f"D500_DATA={tmp_path / 'a-file'}: a file, not a data directory")


def test_a_given_data_folder_is_read_by_reference(tmp_path):
    """reference passes its --data to the early check (else it would ask for --data again)."""
    data = tmp_path / "data"
    data.mkdir()
    out = d500("reference", "mnist-lenet", "--data", str(data),
               env={**os.environ, "D500_HOME": str(tmp_path)})
    one_line_exit_2(out, f"{data}/train-images-idx3-ubyte.gz: missing")


@pytest.mark.parametrize("args, words", [
    (["leaderboard", "--format", "html", "--out", "{dir}"],
     ["{dir}: is a folder; --out takes a file name (e.g. {dir}/leaderboard.html)"]),
    (["leaderboard", "--out", "{dir}"], ["{dir}: is a folder; --out takes a file name"]),
    (["scale", "1", "--network", "2us,12.5GB/s", "--png", "{dir}"],
     ["{dir}: is a folder; --png takes a file name (e.g. {dir}/scale.png)"]),
    (["ledger", "export", "--format", "csv", "--out", "{dir}"],
     ["{dir}: is a folder; --out takes a file name (e.g. {dir}/runs.csv)"]),
    (["check", "{dir}"], ["{dir}: a folder, where a package file (d500 package --out) goes"])])
def test_a_folder_where_a_file_goes(args, words, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    given = [a.format(dir=folder) for a in args]
    one_line_exit_2(d500(*given, env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    *[w.format(dir=folder) for w in words])
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("args, words", [
    (["leaderboard", "--out", "{dir}/board.pdf"],
     ["{dir}/board.pdf: --out writes the board as Markdown to a name ending in .md and as HTML"]),
    (["scale", "1", "--network", "2us,12.5GB/s", "--png", "{dir}/plot.svg"],
     ["{dir}/plot.svg: --png writes PNG: a file name ending in .png (e.g. {dir}/plot.png)"]),
    (["ledger", "export", "--out", "{dir}/runs.xlsx"],
     ["{dir}/runs.xlsx: --out writes CSV to a name ending in .csv, JSON to .json"])])
def test_an_output_named_for_another_format(args, words, tmp_path):
    """board.pdf got the Markdown board, plot.svg a PNG's bytes and runs.xlsx CSV text, without
    a word."""
    given = [a.format(dir=tmp_path) for a in args]
    one_line_exit_2(d500(*given, env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    *[w.format(dir=tmp_path) for w in words])
    assert not [p for p in tmp_path.iterdir() if p.name != "home"]


@pytest.mark.parametrize("args, words", [
    (["train", "digits-mlp", "--submission", ""], ["--submission: is empty: give an entry"]),
    (["package", "", "--out", "x.tar.gz"], ["SUBMISSION_DIR: is empty"]),
    (["train", "", "--submission", "sgd-momentum"], ["the workload is empty: give a level-2"]),
    (["net", "bench", ""], ["the workload is empty: give a level-1"]),
    (["scale", ""], ["the target is empty: give a level-3 run's id"])])
def test_an_empty_argument_says_it_is_empty(args, words, tmp_path):
    """`--submission "$E"` with E unset said 'submission.yaml: no such file', and an empty
    workload '.: no such workload file' (Path('') is the working directory)."""
    one_line_exit_2(d500(*args, env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    *words)


def test_an_entry_path_that_is_not_there_is_said_as_given(tmp_path):
    one_line_exit_2(d500("train", "digits-mlp", "--submission", "./no-such-entry",
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    "./no-such-entry: no such entry (a folder holding submission.yaml, or that "
                    "file)")


def test_an_empty_submission_file_is_said_empty(tmp_path):
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "submission.yaml").write_text("\n")
    one_line_exit_2(d500("train", "digits-mlp", "--submission", str(entry),
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    "submission.yaml: empty, where a mapping of fields is expected")


def _read_only_folder(tmp_path):
    """A folder this process cannot write: a read-only bind mount where root may mount, a folder
    without write permission for anyone else; None where neither holds."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return folder
    mounted = subprocess.run(["mount", "-o", "bind,ro", str(folder), str(folder)],
                             capture_output=True, check=False)
    return folder if mounted.returncode == 0 else None


def test_a_read_only_d500_home_is_one_line_before_a_framework_loads(tmp_path):
    folder = _read_only_folder(tmp_path)
    if folder is None:
        pytest.skip("no read-only folder can be made here (root without mount)")
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules])")
    try:
        env = {**os.environ, "D500_HOME": str(folder)}
        for args in (["ledger", "list"], ["leaderboard"],
                     ["train", "digits-mlp", "--submission", "sgd-momentum", "--seed", "0"],
                     ["tune", "digits-mlp", "--submission", "sgd-momentum"],
                     ["reference", "digits-mlp"]):
            out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                                 text=True, env=env, check=False)
            assert out.stdout.strip() == "2 []", (args, out.stdout, out.stderr)
            assert out.stderr.count("\n") == 1, out.stderr
            said = f"D500_HOME={folder}: cannot use it as the results directory (not writable"
            if args[0] in ("ledger", "leaderboard"):  # they only read: nothing to read here
                said = f"no ledger at {folder}/ledger.sqlite: $D500_HOME={folder} has no "
            assert said in out.stderr, out.stderr
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=False)
        else:
            folder.chmod(0o755)


def test_a_ledger_sqlite_can_not_open_is_one_line(tmp_path):
    (tmp_path / "ledger.sqlite").mkdir()  # SQLite cannot open a folder as its file
    one_line_exit_2(d500("ledger", "list", env={**os.environ, "D500_HOME": str(tmp_path)}),
                    f"{tmp_path}/ledger.sqlite: not a usable ledger database: unable to open")
