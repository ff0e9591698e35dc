"""`d500 help ...` as a new user types it: help on help, and a sub-subcommand's own help."""

from __future__ import annotations

import pytest

from d500.cli import main


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_on_help_is_d500s_help_not_an_error(flag, capsys):
    assert main(["help", flag]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: d500 [--debug]") and err == "", err


def test_help_of_a_subcommand_of_a_command_is_that_subcommands_help(capsys):
    with pytest.raises(SystemExit) as done:  # argparse's --help exits
        main(["help", "ledger", "list"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: d500 ledger list ")
