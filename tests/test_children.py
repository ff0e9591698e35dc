"""The processes that hold an entry's code (d500.children): forked by a clean forkserver, never by
the judge, each new; they take the judge's environment and directory of the moment, a changed
load-time variable falls back to spawning, and `end` ends a child that ignores "exit"."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from d500 import children
from tests.helpers import ME, me, on_host

_MINE: str | None = None  # set by a child in its own memory; a later child must not see it


@pytest.fixture(autouse=True)
def forks(monkeypatch):
    """The forkserver as D500_WORKER_START=forkserver asks for it (d500 spawns by default). The
    suite forks its workers (tests/conftest.py): a forkserver that an earlier test in this
    process started under other load-time variables (since changed: a torch:compiled run sets
    TORCHINDUCTOR_CACHE_DIR) is stopped, so that these tests start one that fits."""
    monkeypatch.setattr(children, "FORK", True)
    if children._server_env not in (None, children._loaded(os.environ)):
        from multiprocessing import forkserver
        forkserver._forkserver._stop()
        children._server_env = None


def test_workers_are_spawned_unless_the_user_asks_for_forks(monkeypatch):
    monkeypatch.setattr(children, "FORK", False)
    assert children.context(["torch"]).get_start_method() == "spawn"


def report(conn, env) -> None:
    """A child: takes `env`, answers what it sees, remembers a mark, then waits for "exit" (or,
    after "stubborn", for nothing)."""
    global _MINE
    children.bound_to_parent()
    children.take_environment(env)
    parent = os.getppid()
    stat = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()
    conn.send({"pid": os.getpid(), "parent": parent, "grandparent": int(stat[1]),
               "parent_line": Path(f"/proc/{parent}/cmdline").read_bytes().decode(),
               "cwd": os.getcwd(), "probe": os.environ.get("D500_CHILD_PROBE"),
               "seen": _MINE, "torch": "torch" in sys.modules})
    _MINE = f"child {os.getpid()}"
    while True:
        message = conn.recv()
        if message == ("stubborn",):
            conn.send("ok")
            while True:  # reads nothing more
                time.sleep(1)
        if message == ("exit",):
            return


def _start(ctx):
    conn, child = ctx.Pipe()
    process = ctx.Process(target=report, args=(child, children.environment()), daemon=True)
    process.start()
    child.close()
    assert conn.poll(300), "the child never answered"
    return conn, process, conn.recv()


def test_children_are_new_forks_of_the_forkserver_with_the_judges_environment_now(
        tmp_path, monkeypatch):
    ctx = children.context()
    assert ctx.get_start_method() == "forkserver"
    monkeypatch.setenv("D500_CHILD_PROBE", "after the forkserver started")  # (it has not this)
    monkeypatch.chdir(tmp_path)
    seen = []
    for _ in range(2):
        conn, process, info = _start(children.context())
        children.end(conn, process)
        assert process.exitcode == 0
        seen.append(info)
    for info in seen:
        assert info["parent"] != os.getpid()  # never forked from this (the judge's) process,
        assert info["grandparent"] == os.getpid() and "forkserver" in info["parent_line"]
        assert info["probe"] == "after the forkserver started"
        assert Path(info["cwd"]) == tmp_path
        assert info["torch"]  # preloaded there, not imported again
        assert info["seen"] is None  # nothing of an earlier child's memory
    assert seen[0]["pid"] != seen[1]["pid"] and seen[0]["parent"] == seen[1]["parent"]


def test_a_child_of_another_framework_is_spawned():
    """A TensorFlow or JAX worker holds no torch: it does not come from the forkserver."""
    assert children.context(["torch"]).get_start_method() == "forkserver"
    for frameworks in (["tensorflow"], ["jax"], ["torch", "tensorflow"], ["an-unknown-one"]):
        assert children.context(frameworks).get_start_method() == "spawn"


def test_a_changed_load_time_variable_spawns(monkeypatch):
    children.context()  # the forkserver running, with this environment's OMP_NUM_THREADS
    monkeypatch.setenv("OMP_NUM_THREADS", str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1))
    ctx = children.context()
    assert ctx.get_start_method() == "spawn"
    conn, process, info = _start(ctx)
    children.end(conn, process)
    assert info["parent"] == os.getpid()


def test_end_kills_a_child_that_does_not_exit():
    conn, process, _ = _start(children.context())
    conn.send(("stubborn",))
    assert conn.recv() == "ok"
    children.end(conn, process, wait=0.5)  # "exit" is read, but the child goes on
    assert not process.is_alive()


def test_a_forked_worker_not_ready_in_time_is_replaced_by_a_spawned_one(tmp_path, monkeypatch,
                                                                        capfd):
    """The fallback for a forked worker that never becomes ready (seen once in a whole suite):
    with no time allowed to the fork, a spawned worker trains the run, which succeeds."""
    from d500.ledger import Ledger
    from d500.training import submission, trainer, worker, workloads
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(worker, "FORKED_READY", 0.0)
    monkeypatch.setattr(children, "METHOD", "forkserver")  # whatever earlier tests changed
    started = []
    real = worker.Worker._start
    monkeypatch.setattr(worker.Worker, "_start", lambda self, ctx: (
        started.append(ctx.get_start_method()), real(self, ctx))[1])
    wl = workloads.load(root / "levels" / "2-training" / "digits-mlp.yaml")
    entry = submission.load(root / "submissions" / "sgd-momentum")
    result = trainer.train(wl, entry.recipe, "torch", 0, ledger=Ledger(), submission="sgd")
    assert result.status == "succeeded", result.error
    assert started == ["forkserver", "spawn"]
    assert "a forked worker was not ready within 0 s; starting a spawned one" in capfd.readouterr(
        ).err


def _confined(queue) -> None:
    import ctypes
    children.confine()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":" in line)
    queue.put(({k: int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapInh")},
               int(status["NoNewPrivs"]), ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)))


def _shielded(queue) -> None:
    import ctypes
    children.shield()
    queue.put(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE


@pytest.mark.skipif(sys.platform != "linux", reason="capabilities and prctl are Linux's")
def test_a_confined_child_holds_no_capability_and_a_shield_makes_the_judge_undumpable():
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    for target in (_confined, _shielded):
        process = ctx.Process(target=target, args=(queue,))
        process.start()
        process.join(60)
    caps, no_new_privs, dumpable = queue.get(timeout=5)
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapInh"] == 0, caps
    if os.geteuid() == 0:  # root's bounding set emptied too (a user's needs CAP_SETPCAP)
        assert caps["CapBnd"] == 0, caps
    assert no_new_privs == 1
    assert dumpable == 1  # a confined rank stays readable by its peers (MPI reads their memory)
    assert queue.get(timeout=5) == 0  # a shielded judge is not dumpable


def _kept_stubborn(conn) -> None:
    """A kept child (behind children.keep) that leaves a double-forked sleeper behind, says its
    pid, then reads nothing more."""
    children.bound_to_parent()
    children.keep()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            conn.send(me())
            time.sleep(120)
        os._exit(0)
    while True:
        time.sleep(1)


def _running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _outlives(pid: int | None) -> bool:
    """Whether process `pid` still runs 5 s from now (polled: at once where it ends sooner)."""
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pid)


def _spawned(target, *args):
    """`target(conn, *args)` in a spawned daemon process: (this end of `conn`, the process)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    child.close()
    return conn, process


@pytest.mark.skipif(sys.platform != "linux", reason="the keeper is Linux's (a subreaper)")
def test_ending_a_kept_child_that_does_not_exit_ends_what_it_left_behind():
    """`end` on a worker stuck in the entry's code: the keeper ends the kept process and what
    it left behind; killing the keeper outright orphaned the sleeper to init, where it ran on."""
    conn, process = _spawned(_kept_stubborn)
    assert conn.poll(120), "the sleeper never said its pid"
    left = on_host(conn.recv())
    assert left is not None, "the sleeper is not found from the host"
    try:
        children.end(conn, process, wait=0.5)
        assert not process.is_alive()
        assert not _outlives(left), f"process {left} outlived its ended keeper"
    finally:
        if _running(left):
            os.kill(left, 9)


def _parricide(conn) -> None:
    """A kept child (behind children.keep, confined) that leaves a double-forked sleeper behind,
    then kills its keeper (its parent, or found through /proc) and exits."""
    import signal
    children.bound_to_parent()
    mode = children.keep()
    children.confine()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            conn.send((mode, me()))
            time.sleep(120)
        os._exit(0)
    time.sleep(0.5)
    above = {os.getppid()}
    try:
        above.add(int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[1]))
    except (OSError, ValueError):
        pass
    for pid in above - {0, os.getpid()}:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    os._exit(0)


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's")
def test_a_kept_process_that_kills_its_keeper_leaves_nothing_behind():
    """The kept process is its user's: before, it could SIGKILL (or SIGSTOP) its keeper and
    what it left then ran on, orphaned to init. In a PID namespace of its own it names no
    process outside it, and its end ends all the namespace holds."""
    conn, process = _spawned(_parricide)
    assert conn.poll(120), "the sleeper never said its pid"
    mode, named = conn.recv()
    left = on_host(named)  # (None: ended already, its keeper killed)
    try:
        if mode != "namespace":
            pytest.skip("this kernel permits no PID namespace here: the keeper is a subreaper")
        process.join(30)
        assert not _outlives(left), f"process {left} outlived the kept process"
    finally:
        if _running(left):
            os.kill(left, 9)
        if process.is_alive():
            process.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="the keeper is Linux's (a subreaper)")
def test_nothing_the_optimizer_probe_starts_outlives_it(tmp_path):
    """The hyperparameter probe (d500.training.entry) imports the entry's file: a process its
    top-level code leaves behind (a double fork, stdio closed, as a daemon does) ends with the
    probe. Before, it ran on beside the judge, which it could wait for (a judge not yet
    shielded, /proc/PID/mem opened then stays readable)."""
    from d500.training.entry import EntryOptimizer
    mark = tmp_path / "left"
    (tmp_path / "leave.py").write_text(
        "import os, time\nfrom d500.training.optimizers.sgd import Momentum\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        null = os.open(os.devnull, os.O_RDWR)\n"
        "        for fd in (0, 1, 2):\n            os.dup2(null, fd)\n"
        f"        open({str(mark)!r} + '.new', 'w').write({ME})\n"
        f"        os.rename({str(mark)!r} + '.new', {str(mark)!r})\n"
        "        time.sleep(120)\n    os._exit(0)\n"
        f"while not os.path.exists({str(mark)!r}):\n    time.sleep(0.01)\n\n\n"
        "class Leave(Momentum):\n    name = 'leave'\n")
    entry = EntryOptimizer(tmp_path / "leave.py", "Leave")
    entry.probe([{"lr": 0.1}])
    assert entry.name == "leave"
    left = on_host(mark.read_text())  # (None: ended with the probe)
    try:
        assert not _outlives(left), f"process {left} outlived the probe"
    finally:
        if _running(left):
            os.kill(left, 9)


def _probed(queue, file, launcher) -> None:
    import ctypes

    from d500.training.entry import EntryOptimizer
    if launcher:
        os.environ["PMI_RANK"] = "0"
    EntryOptimizer(Path(file), "Plain").probe([{"lr": 0.1}])
    queue.put(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_judge_is_shielded_before_the_optimizer_probe_runs_the_entrys_code(tmp_path):
    """The probe is the first of the entry's code a judge starts: a plain user's judge was
    still readable then (a /proc/PID/mem opened while it is stays readable after `shield`).
    An MPI rank (level 3's probe) stays readable by its peers."""
    import multiprocessing
    file = tmp_path / "plain.py"
    file.write_text("from d500.training.optimizers.sgd import Momentum\n\n\n"
                    "class Plain(Momentum):\n    name = 'plain'\n")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    seen = []
    for launcher in (False, True):
        process = ctx.Process(target=_probed, args=(queue, str(file), launcher))
        process.start()
        seen.append(queue.get(timeout=120))
        process.join(30)
    assert seen == [0, 1]


def _forger(conn, folders: list[str]) -> None:
    """A kept, confined child that tries to create a file in each of `folders` by absolute
    path, by a path relative to the working directory it started in, and from a user and mount
    namespace of its own after detaching the mounts (or binding "/" alone to reach under them);
    sends what happened to each."""
    import ctypes
    children.bound_to_parent()
    mode = children.keep()
    children.confine()
    libc = ctypes.CDLL(None, use_errno=True)

    def write(path: str) -> str:
        try:
            with open(path, "a") as out:
                out.write("# forged\n")
            os.unlink(path)
            return "written"
        except OSError as err:
            return os.strerror(err.errno)

    found = {f: [write(f"{f}/forged-{os.getpid()}"),
                 write(os.path.relpath(f"{f}/forged-{os.getpid()}"))] for f in folders}
    from d500.paths import cache
    found["cache"] = write(f"{cache('torch-inductor')}/kernel")  # (its own Inductor's)
    found["judge's cache"] = write(f"{os.environ['D500_HOME']}/cache/kernel")
    if os.fork() == 0:  # every capability, in namespaces of its own
        mine = libc.unshare(0x10000000 | 0x00020000) == 0  # CLONE_NEWUSER | CLONE_NEWNS
        root = f"/tmp/d500-forger-{os.getpid()}"
        os.mkdir(root)
        libc.mount(b"/", root.encode(), None, 0x1000, None)  # MS_BIND, not recursive
        for f in folders:
            libc.umount2(f.encode(), 2)  # MNT_DETACH
            found[f] += [write(f"{f}/forged-ns"), write(f"{root}{f}/forged-ns")]
        libc.umount2(root.encode(), 2)
        os.rmdir(root)
        conn.send((mode, mine, found))
        os._exit(0)
    os.wait()
    os._exit(0)


@pytest.mark.skipif(sys.platform != "linux", reason="mount namespaces are Linux's")
def test_a_kept_process_cannot_write_the_ledger_or_d500s_code(tmp_path, monkeypatch):
    """The entry's process sees the results directory, the folder d500 is imported from, the
    Python it runs on and the rest of the system (but the temporary folder) read-only: before,
    an optimizer wrote the ledger file, /etc and a .pth file into site-packages (run by every
    later interpreter: the next run's judge). Not by a path
    relative to the directory it started in (on the writable mount), nor once it unshares a
    user and mount namespace of its own (tests/training/test_entry_writes.py: in a real run).
    The entries' own cache stays writable; the judges' caches beside it do not (the entry
    wrote the judge's Inductor kernels, peak FLOP/s and pickled node tests)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("D500_HOME", str(home))
    monkeypatch.chdir(Path(children.__file__).parents[1])
    folders = [str(home), str(Path(children.__file__).parent), "/etc"]  # (/etc/ld.so.preload:
    # a library every later process loads, the judge's included, where the entry runs as root)
    conn, process = _spawned(_forger, folders)
    assert conn.poll(120), "the forger said nothing"
    mode, unshared, found = conn.recv()
    process.join(30)
    if mode != "namespace":
        pytest.skip("this kernel permits no namespaces here")
    assert unshared  # (the kernel let it try)
    for folder in folders:
        assert "written" not in found[folder], (folder, found[folder])
    assert found["cache"] == "written"  # a torch:compiled worker writes its kernels there
    assert found["judge's cache"] != "written"
    assert (home / "cache" / "entries" / "torch-inductor").is_dir()
