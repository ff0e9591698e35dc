"""An entry's code cannot write what a judge reads later (d500.children.keep's read-only view):
the ledger's folder, d500's own code and the Python it runs on (a .pth file in site-packages
runs in every later interpreter: the next run's judge), by absolute path, by a path relative to
the working directory it started in, or after unsharing a user and mount namespace of its own
to take the read-only mounts away."""

from __future__ import annotations

import contextlib
import json
import sys
import sysconfig
from pathlib import Path

import pytest

import d500
from d500 import children
from d500.ledger import Ledger

from . import entries
from .entries import ROOT

MARK = "d500-forged-by-an-entry"

# At its first update, tries to create a file in each folder of $D500_TARGETS (by absolute path,
# by a path relative to its working directory where it lies under it, and after unsharing a user
# and mount namespace and detaching the mount above it), and to open the ledger for writing;
# writes what happened to $D500_REPORT.
FORGE = '''
import ctypes, errno, json, os
from d500.training.optimizers import Optimizer

MARK = "@MARK@"


def _try(path):
    try:
        with open(path, "a") as out:
            out.write("# forged\\n")
        return "written"
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))


def _forge():
    found = {}
    for folder in json.loads(os.environ["D500_TARGETS"]):
        name = os.path.join(folder, f"{MARK}-{os.getpid()}.pth")
        found[folder] = [_try(name)]
        cwd = os.getcwd()
        if folder.startswith(cwd + os.sep):
            found[folder].append(_try(os.path.relpath(name)))
    found["ledger"] = _try(os.environ["D500_LEDGER_FILE"])
    if os.fork() == 0:  # a namespace of its own, where it holds every capability
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.unshare(0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS
        out = {"unshared": done == 0}
        above = os.environ["D500_REPORT"] + ".root"  # "/" bound alone, without its mounts
        os.mkdir(above)
        out["bound"] = libc.mount(b"/", above.encode(), None, 4096, None) == 0
        for folder in json.loads(os.environ["D500_TARGETS"]):
            libc.umount2(folder.encode(), 2)  # MNT_DETACH
            libc.mount(None, folder.encode(), None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND
            name = f"{MARK}-{os.getpid()}-ns.pth"
            out[folder] = [_try(os.path.join(folder, name)), _try(above + folder + "/" + name)]
        with open(os.environ["D500_REPORT"] + ".ns", "w") as f:
            json.dump(out, f)
        os._exit(0)
    os.wait()
    with open(os.environ["D500_REPORT"], "a") as f:
        f.write(json.dumps(found) + "\\n")


class Forge(Optimizer):
    name = "forge"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1:
            _forge()
        ops.add_(params, grads, -lr)
'''.replace("@MARK@", MARK)


def _forged(folders: list[str]) -> list[Path]:
    return [p for f in folders for p in Path(f).glob(f"{MARK}-*")]


@pytest.mark.slow  # (a real run, ~15 s: tests/test_children.py performs the attack in ~2 s)
@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_an_entry_cannot_write_the_ledger_d500_or_its_python(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("D500_HOME", str(home))
    # spawned: a fork of the suite's forkserver splits with the forkserver's environment, whose
    # D500_HOME is an earlier test's (the job's environment comes after: d500.children.protected)
    monkeypatch.setattr(children, "METHOD", "spawn")
    monkeypatch.chdir(ROOT)  # the working directory a judge runs in: the repository
    ledger = Ledger()
    package = str(Path(d500.__file__).resolve().parent)
    folders = [str(home), package, sysconfig.get_paths()["purelib"]]
    report = tmp_path / "report.jsonl"
    monkeypatch.setenv("D500_TARGETS", json.dumps(folders))
    monkeypatch.setenv("D500_REPORT", str(report))
    monkeypatch.setenv("D500_LEDGER_FILE", str(ledger.path))
    try:
        result = entries.run(entries.entry(tmp_path, FORGE, "Forge"), ledger=ledger)
        assert result.status in ("succeeded", "missed"), result.error
        looks = [json.loads(line) for line in report.read_text().splitlines()]
        assert len(looks) == 2  # the warm-up's step before the clock, and step 1 of the run
        for look in looks:
            assert look["ledger"] != "written", look
            for folder in folders:
                assert "written" not in look[folder], (folder, look)
        escaped = json.loads(Path(str(report) + ".ns").read_text())
        for folder in folders:
            assert "written" not in escaped[folder], (folder, escaped)
        assert not _forged(folders)
    finally:
        for path in _forged(folders):
            with contextlib.suppress(OSError):
                path.unlink()
