"""A mistyped command, option or choice: one line with the closest name; a bad count refused as
the command line is read, before a framework loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_cli import d500, one_line_exit_2


@pytest.mark.parametrize("args, words", [
    (["bakends"], ["unknown command 'bakends'", "did you mean 'backends'?"]),
    (["net", "lsit"], ["invalid choice: 'lsit'", "(did you mean 'list'?)"]),
    (["leaderboard", "--format", "htm"], ["invalid choice: 'htm'", "(did you mean 'html'?)"]),
    (["leaderboard", "--format", "HTM"], ["invalid choice: 'HTM'", "(did you mean 'html'?)"]),
    (["net", "bench", "mlp-mnist", "--backnds", "torch"],
     ["unrecognized arguments: --backnds torch (did you mean '--backends'?)"]),
    # the mistyped option, not the required one it left missing
    (["train", "digits-mlp", "--submision", "sgd-momentum"],
     ["unrecognized arguments: --submision (did you mean '--submission'?)"]),
    (["train", "digits-mlp", "--submision=sgd-momentum"],
     ["unrecognized arguments: --submision=sgd-momentum (did you mean '--submission'?)"]),
    # a positional given as an option; an option judged on its name, not on the shared '--'
    (["train", "--workload", "digits-mlp", "--submission", "sgd-momentum"],
     ["--workload (the workload goes without '--workload': d500 train WORKLOAD ...)"]),
    (["net", "check", "--model", "m.onnx"],
     ["--model (the model goes without '--model': d500 net check MODEL ...)"]),
    # another word for an option: the one the command takes
    (["check", "x.d500", "--key", "me.pub"],
     ["unrecognized arguments: --key me.pub (did you mean '--trust'?)"]),
    (["package", "sgd-momentum", "--out", "x.d500", "--key", "me.key"],
     ["unrecognized arguments: --key me.key (did you mean '--sign'?)"])])
def test_a_mistyped_name_gets_the_closest(args, words, tmp_path):
    import os
    one_line_exit_2(d500(*args, env={**os.environ, "D500_HOME": str(tmp_path)}), *words)


@pytest.mark.parametrize("args, words", [
    (["ledger"], ["required: COMMAND (one of list, show, export, verify, import)"]),
    (["op"], ["required: COMMAND (one of validate, bench)"]),
    (["--versoin"], ["d500: error: unknown option '--versoin' (before a command d500 takes "
                     "--debug, --version or --help; did you mean '--version'?)"])])
def test_a_missing_subcommand_names_them_and_a_mistyped_option_of_d500_its_own(args, words,
                                                                             capsys):
    from d500.cli import main
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err


def test_help_of_a_command_is_its_own_help(capsys):
    from d500.cli import main
    with pytest.raises(SystemExit) as done:  # argparse's --help exits
        main(["help", "train"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: d500 train [-h] --submission DIR")


def test_a_missing_required_option_is_still_said_and_a_prefix_is_no_typo(tmp_path):
    import os
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    one_line_exit_2(d500("train", "digits-mlp", env=env),
                    "the following arguments are required: --submission")
    out = d500("tune", "--sub", "sgd-momentum", env=env)  # argparse's prefix of --submission
    one_line_exit_2(out, "the following arguments are required: workload")


@pytest.mark.parametrize("args", [
    ["tune", "digits-mlp", "--submission", "sgd-momentum", "--studies", "0"],
    ["tune", "digits-mlp", "--submission", "sgd-momentum", "--trials", "-2"],
    ["train", "digits-mlp", "--submission", "sgd-momentum", "--seeds", "0"],
    ["op", "validate", "numpy-im2col-conv", "--directions", "0"],
    ["reproduce", "no-such.d500pkg", "--runs", "0"]])
def test_a_count_below_one_is_refused_before_a_framework_loads(args, tmp_path):
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules])")
    import os
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**os.environ, "D500_HOME": str(tmp_path)}, check=False)
    assert out.stdout.strip() == "2 []", (out.stdout, out.stderr)
    assert "expected an integer >= 1, got" in out.stderr, out.stderr


def test_a_mistyped_workload_or_optimizer_gets_the_closest(tmp_path):
    import os
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    one_line_exit_2(d500("net", "bench", "mlp-mnst", env=env),
                    "no level-1 workload named 'mlp-mnst'", "; did you mean 'mlp-mnist'?)")
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "submission.yaml").write_text(
        "name: e\nlevel: 2\nworkloads: [digits-mlp]\noptimizer: momentun\nbatch_size: 32\n")
    one_line_exit_2(d500("train", "digits-mlp", "--submission", str(entry), env=env),
                    "field 'optimizer' is 'momentun'", "did you mean 'momentum'?")


def test_another_subcommands_option_gets_no_hint_of_itself(tmp_path):
    """`d500 ledger`'s own --ledger given after its command is no typo: the line says where it
    goes (a user who ran `d500 ledger import P --ledger F` got only 'unrecognized')."""
    import os
    env = {**os.environ, "D500_HOME": str(tmp_path)}
    out = d500("ledger", "list", "--ledger", "x", env=env)
    one_line_exit_2(out, "unrecognized arguments: --ledger x (--ledger goes before the "
                         "command: d500 ledger --ledger FILE list ...)")
    assert "did you mean" not in out.stderr
    out = d500("ledger", "import", "p.tar.gz", "--ledger", "x", env=env)
    one_line_exit_2(out, "(--ledger goes before the command: d500 ledger --ledger FILE import")


def test_an_operator_file_without_its_class_asks_for_the_class(tmp_path):
    import os
    op = tmp_path / "my_op.py"
    op.write_text("raise SystemExit('a user file is never imported to say this')\n")
    one_line_exit_2(d500("op", "validate", str(op), "--input-shape", "4,4",
                         env={**os.environ, "D500_HOME": str(tmp_path / "home")}),
                    f"'{op}': name the operator class in it too ({op}:Class)")


@pytest.mark.parametrize("level, extra, words", [
    (2, "schedule: {name: cosin}", "unknown schedule 'cosin' (known: constant, step, cosine, "
                                   "polynomial; did you mean 'cosine'?)"),
    (2, "schedule: {name: cosine, warmpu: 0.1}", "unknown parameter 'warmpu' (known: floor, "
                                                 "warmup, warmup_steps, warmup_start; did you "
                                                 "mean 'warmup'?)"),
    (2, "hyperparameters: {momentun: 0.9}", "unknown hyperparameter 'momentun' (known: lr, "
                                            "momentum, nesterov, weight_decay; did you mean "
                                            "'momentum'?)"),
    (2, "search_space: {lr: {min: 0.1, max: 0.2, scael: log}}",
     "unknown key 'scael' (allowed: min, max, scale, integer, values; did you mean 'scale'?)"),
    (2, "batch_schedule: {growth: 2, every_epochs: 2, mx: 256}", "did you mean 'max'?)"),
    (3, "distributed: {scheme: synk}", "unknown scheme 'synk' (known: async_ps, "),
    (3, "distributed: {scheme: synk}", "; did you mean 'sync'?)"),
    (3, "distributed: {scheme: sync, pipelin: 2}", "unknown field 'distributed.pipelin' "
                                                   "(allowed: scheme, "),
    (3, "distributed: {scheme: sync, pipelin: 2}", "; did you mean 'pipeline'?)")])
def test_a_mistyped_name_in_a_submission_file_gets_the_closest(level, extra, words, tmp_path,
                                                                monkeypatch, capsys):
    from d500.cli import main
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "submission.yaml").write_text(
        f"name: e\nlevel: {level}\nworkloads: [digits-mlp]\noptimizer: momentum\n"
        f"batch_size: 32\n{extra}\n")
    code = main(["train", "digits-mlp", "--submission", str(tmp_path / "e"), "--seed", "0",
                 *(["--show-partition"] if level == 3 else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err


def test_train_help_says_how_a_level3_entry_runs():
    """A level-3 user's first `d500 train --help` named level 2's folder only and no mpiexec;
    tune (level 2 only) names level 2's folder."""
    train, tune = d500("train", "--help"), d500("tune", "--help")
    assert train.returncode == tune.returncode == 0
    text = " ".join(train.stdout.split())
    assert "(`mpiexec -n N d500 train ...`)" in text and "levels/3-distributed/*.yaml" in text
    assert "levels/3-distributed" not in tune.stdout
