"""An output the user names (--out, --png) that cannot be written is one line naming it and why:
`d500 scale --png` wrote its plot unguarded (a traceback), and a file where a folder goes said
only 'File exists'."""

from __future__ import annotations

import pytest

from d500.errors import UsageError
from d500.paths import write_output


def test_bytes_and_text_under_a_file_are_one_line(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for data in (b"\x89PNG", "text"):
        with pytest.raises(UsageError) as err:
            write_output(blocked / "sub" / "x.png", data)
        assert str(err.value) == (f"{blocked / 'sub' / 'x.png'}: cannot write it ({blocked} is a "
                                  f"file, not a folder)")
    assert write_output(tmp_path / "new" / "x.png", b"\x89PNG").read_bytes() == b"\x89PNG"


def test_a_ledger_or_key_under_a_file_is_one_line(tmp_path):
    """`d500 reproduce --ledger` under a file was a FileExistsError traceback; keygen said only
    'File exists'."""
    from d500.competition import signing
    from d500.ledger import Ledger
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(UsageError, match=rf"x.sqlite: cannot make its folder \({blocked} is a "
                                         rf"file, not a folder\)$"):
        Ledger(blocked / "x.sqlite")
    with pytest.raises(UsageError, match=rf"k: cannot write the key \({blocked} is a file, not "
                                         rf"a folder\)$"):
        signing.generate(blocked / "k")


def test_a_results_directory_that_is_a_file_or_under_one_is_named_as_such(tmp_path,
                                                                          monkeypatch):
    """D500_HOME naming a file said only '(File exists)'; under a file, 'Not a directory'."""
    from d500.paths import home
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for path, why in ((blocked, "it is a file, not a folder"),
                      (blocked / "sub", f"{blocked} is a file, not a folder")):
        monkeypatch.setenv("D500_HOME", str(path))
        with pytest.raises(UsageError) as err:
            home()
        assert str(err.value) == (f"D500_HOME={path}: cannot use it as the results directory "
                                  f"({why})")
