"""An output the user names (--out, --png) that cannot be written is one line naming it and why:
`d500 scale --png` wrote its plot unguarded (a traceback), and a file where a folder goes said
only 'File exists'."""

from __future__ import annotations

import os

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
    with pytest.raises(UsageError, match=rf"k: cannot write it \({blocked} is a file, not "
                                         rf"a folder\)$"):  # (said before the key is made)
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


@pytest.mark.parametrize("args", [
    ["scale", "digits-mlp", "--png", "afile/x.png"],  # was said after the ledger was read
    ["leaderboard", "--out", "afile/x.md"],
    ["ledger", "export", "--out", "afile/x.csv"],
    ["package", "sync", "--out", "afile/x.tar.gz"],
    ["keygen", "afile/sub/k"]])
def test_an_output_under_a_file_is_refused_before_any_work(args, tmp_path):
    """One line naming the option, the path and why, exit 2, before anything is read or made:
    no results directory (the ledger, a network sweep) is touched."""
    import subprocess
    import sys
    (tmp_path / "afile").write_text("")
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "-m", "d500.cli", *args], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "D500_HOME": str(home)},
                          timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    option = args[-2] if args[-2].startswith("--") else "KEYFILE"
    assert done.stderr.endswith(f": error: {option} {args[-1]}: cannot write it (afile is a file, "
                                f"not a folder)\n"), done.stderr
    assert not home.exists()


def test_an_output_in_an_unwritable_folder_is_refused_before_writing(tmp_path):
    from d500.paths import output_file
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user writes where the mode says it may not (root)")
        with pytest.raises(UsageError, match=rf"x.md: cannot write it \({folder} is not "
                                             rf"writable\)$"):
            output_file(folder / "new" / "x.md", "x.md")
    finally:
        folder.chmod(0o700)
