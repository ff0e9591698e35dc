"""A workload file of another level, given to a command of one level: one line naming the file,
its level and the level the command takes (not the first field that level does not know)."""

from __future__ import annotations

import os

import pytest

from d500 import workload
from d500.errors import ConfigError
from d500.paths import rulebook
from tests.test_cli import d500, one_line_exit_2

L0 = str(rulebook() / "0-operators" / "relu-4d.yaml")
L1 = str(rulebook() / "1-networks" / "mlp-mnist.yaml")
L2 = str(rulebook() / "2-training" / "digits-mlp.yaml")
L3 = str(rulebook() / "3-distributed" / "digits-mlp.yaml")


@pytest.mark.parametrize("args, file, given, takes", [
    (["net", "bench", L2], L2, 2, "1"),
    (["net", "bench", L0], L0, 0, "1"),
    (["op", "validate", "numpy-im2col-conv", "--case", L1], L1, 1, "0"),
    (["train", L1, "--submission", "sgd-momentum"], L1, 1, "2 or 3"),
    (["tune", L0, "--submission", "sgd-momentum"], L0, 0, "2 or 3"),
    (["scale", L2, "--network", "2us,12.5GB/s"], L2, 2, "3")])
def test_a_workload_of_another_level_is_said_so(args, file, given, takes, tmp_path):
    out = d500(*args, env={**os.environ, "D500_HOME": str(tmp_path)})
    one_line_exit_2(out, f"{file}: a level-{given} file (field 'level'), where this command "
                         f"takes level {takes}")
    assert "unknown field" not in out.stderr


@pytest.mark.parametrize("loader, file, takes", [
    ("d500.training.workloads", L3, 2), ("d500.distributed.workloads", L2, 3),
    ("d500.networks.workloads", L3, 1)])
def test_each_levels_loader_names_the_level_first(loader, file, takes):
    """The library the commands call: a level-2 file with `tuning:` read by level 3 is a level-2
    file, not 'tuning is not allowed at level 3'."""
    import importlib
    with pytest.raises(ConfigError, match=f"where this command takes level {takes}$"):
        importlib.import_module(loader).load(file)


def test_scale_reads_a_level3_workload_file_by_its_name(tmp_path):
    """A file path works where a name does (the rulebook's file, named `digits-mlp` inside)."""
    from d500.ledger import Ledger
    Ledger(tmp_path / "ledger.sqlite").close()  # one without level-3 runs (scale only reads)
    out = d500("scale", L3, "--network", "2us,12.5GB/s",
               env={**os.environ, "D500_HOME": str(tmp_path)})
    one_line_exit_2(out, "no succeeded level-3 run of 'digits-mlp' at 2 or more ranks")


def test_a_folder_where_a_yaml_file_goes(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path}: a folder, where a YAML file is"):
        workload.read_yaml(tmp_path)


def test_net_check_given_a_workload_file_names_net_bench(tmp_path):
    out = d500("net", "check", L1, env={**os.environ, "D500_HOME": str(tmp_path)})
    one_line_exit_2(out, f"{L1}: a YAML file; `net check` takes an ONNX file", "net bench")


def test_a_name_of_another_levels_workload_names_its_file():
    """`d500 train mlp-mnist` (a level-1 workload) listed level 2's names and nothing more; a
    file path of another level was already said so (above)."""
    with pytest.raises(ConfigError, match=f"; mlp-mnist is a workload of another level: {L1}\\)$"):
        workload.find("mlp-mnist", rulebook() / "2-training", 2)
    with pytest.raises(ConfigError, match="did you mean 'digits-mlp'"):  # a typo: the hint
        workload.find("digits-mpl", rulebook() / "2-training", 2)
