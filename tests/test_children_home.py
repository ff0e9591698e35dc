"""A kept process reads nothing of the results directory but the entries' cache and the folders
it is shown (d500.children.keep's `_hide_home`): before, its mount namespace made $D500_HOME
read-only and the entry's code read the ledger, the MLLOGs and the checkpoints (a real run:
tests/training/test_home_hidden.py). Not by a path relative to a working directory that lay
there, nor from a user and mount namespace of its own, detaching the cover or binding "/" alone
to reach under it. Also where the process splitting was confined already (the optimizer probe
started by a level-3 rank; `mpiexec d500 tune`'s ranks are not confined, and their level-2
workers split with root's capabilities): root without capabilities may not map itself in
the user namespace it then takes, and with no user mapped it creates no file in a filesystem
mounted there (EOVERFLOW: the first version's tmpfs cover could not hold its mount points and hid
nothing), though it writes its cache on the host's (below)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from d500 import children


def _peeker(conn, inside: str, shown: str, confined: bool) -> None:
    """A kept, confined child started in folder `inside` of the results directory, shown the
    folder `shown` (`confined`: confined before it splits too, as a rank is): sends what it
    could read there."""
    import ctypes
    os.chdir(inside)  # the judge's working directory, in the results directory
    children.bound_to_parent()
    if confined:
        children.confine()
    mode = children.keep(shown=[shown])
    children.confine()
    home = os.environ["D500_HOME"]

    def read(path: str) -> str:
        try:
            with open(path, "rb") as f:
                return "read" if f.read() else "empty"
        except OSError as err:
            return os.strerror(err.errno)

    def write(path: str) -> str:
        try:
            with open(path, "w") as f:
                f.write("kernel")
            return read(path)
        except OSError as err:
            return os.strerror(err.errno)

    from d500.paths import cache
    found = {"ledger": read(f"{home}/ledger.sqlite"), "mllog": read(f"{home}/runs/1/mllog.txt"),
             "relative": read("../ledger.sqlite"), "cwd": os.getcwd(),
             "listed": sorted(os.listdir(home)), "shown": read(f"{shown}/opt.py"),
             "cache": write(f"{cache('torch-inductor')}/kernel"),
             "judge's cache": read(f"{home}/cache/torch-inductor/kernel")}
    if os.fork() == 0:  # every capability, in namespaces of its own
        libc = ctypes.CDLL(None, use_errno=True)
        found["unshared"] = libc.unshare(0x10000000 | 0x00020000) == 0  # NEWUSER | NEWNS
        root = f"/tmp/d500-peeker-{os.getpid()}"
        os.mkdir(root)
        libc.mount(b"/", root.encode(), None, 0x1000, None)  # MS_BIND, not recursive
        found["under"] = read(f"{root}{home}/ledger.sqlite")
        libc.umount2(root.encode(), 2)
        os.rmdir(root)
        libc.umount2(home.encode(), 2)  # MNT_DETACH
        found["detached"] = read(f"{home}/ledger.sqlite")
        conn.send((mode, found))
        os._exit(0)
    os.wait()
    os._exit(0)


@pytest.mark.skipif(sys.platform != "linux", reason="mount namespaces are Linux's")
@pytest.mark.parametrize("confined", [False, True], ids=["split", "split-when-confined"])
def test_a_kept_process_reads_nothing_of_the_results_directory(tmp_path, monkeypatch,
                                                                confined):
    home = tmp_path / "home"
    (home / "runs" / "1").mkdir(parents=True)
    (home / "ledger.sqlite").write_text("every run's figures")
    (home / "runs" / "1" / "mllog.txt").write_text(":::MLLOG eval_accuracy 0.87")
    (home / "cache" / "torch-inductor").mkdir(parents=True)
    (home / "cache" / "torch-inductor" / "kernel").write_text("the judge's")
    shown = home / "reproduce" / "entry"  # an entry d500 reproduce wrote there
    shown.mkdir(parents=True)
    (shown / "opt.py").write_text("class Opt: pass")
    monkeypatch.setenv("D500_HOME", str(home))
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=_peeker, daemon=True,
                          args=(child, str(home / "runs"), str(shown), confined))
    process.start()
    child.close()
    assert conn.poll(120), "the peeker said nothing"
    mode, found = conn.recv()
    process.join(30)
    if mode != "namespace":
        pytest.skip("this kernel permits no namespaces here")
    for what in ("ledger", "mllog", "relative", "judge's cache", "under", "detached"):
        assert found[what] == "No such file or directory", (what, found)
    # (the kernel let it try; where it split confined, as root, no user is mapped in its user
    # namespace, and such a process may not make another)
    assert found["unshared"] or (confined and os.geteuid() == 0), found
    assert found["listed"] == ["cache", "reproduce"], found  # the folders it is shown, alone
    assert found["cwd"] == str(home)  # its nearest folder still seen
    assert found["shown"] == "read" and found["cache"] == "read", found
    assert (home / "cache" / "entries" / "torch-inductor" / "kernel").read_text() == "kernel"
    assert (home / "ledger.sqlite").read_text() == "every run's figures"


def test_hidden_names_what_the_results_directory_holds_but_the_entries_cache(tmp_path,
                                                                             monkeypatch):
    home = tmp_path / "home"
    (home / "cache" / "entries").mkdir(parents=True)
    monkeypatch.setenv("D500_HOME", str(home))
    assert children.hidden(home / "cache" / "models" / "m.onnx")
    assert children.hidden(home)
    assert not children.hidden(home / "cache" / "entries" / "k")
    assert not children.hidden(tmp_path / "model.onnx")
    assert not children.hidden(Path(children.__file__))
