"""The test session's settings: its policy on machine load, level-2 workers forked, d500's bytecode
compiled once, and the order in which xdist's workers take the files.

The policy on machine load: a run counts as timed on a loaded machine only when other
processes took the whole machine (D500_LOADED_SHARE=1, an organiser's setting; d500's default is
a quarter). The suite's own runs share this machine with its other tests and whatever else runs
here, and its boards compare such runs; at the default share they would be ranked apart, or not,
by the neighbours' load. Tests of load itself set the share they test (monkeypatch), or fake the
load far above any share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("D500_LOADED_SHARE", "1.0")  # inherited by every d500 process a test starts
# Level-2 workers forked from a forkserver that has torch imported (d500.children), in this process
# and every d500 process a test starts: a spawned worker imported torch again. Measured side by
# side, one process at a time (CPU of the whole process tree, load 7-9): tests/training/
# test_tune.py 34.4 -> 28.7 s, tests/training/test_isolation.py 50.9 -> 42.8 s. Not d500's
# default (timed runs spawn); the forkserver is a fresh interpreter that never holds the judge's
# memory, so the isolation tests prove what they prove. tests/test_children.py tests both starts.
os.environ.setdefault("D500_WORKER_START", "forkserver")
ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """d500's bytecode, written once before any test (by the controller, not each xdist worker),
    and the machine's peak FLOP/s measured (below).
    An editable install is never compiled, and where PYTHONDONTWRITEBYTECODE is set (as on the
    shared machine) no import writes it: every d500 process a test starts (a CLI run, an MPI rank, a
    level-2 worker) compiled each d500 module it imported, 0.27 s of CPU of a level-3 rank's
    0.54 s of d500 imports (benchmarks/bytecode.py). Python checks a .pyc against its source's
    mtime and size: a stale one is never used."""
    if not hasattr(config, "workerinput") and (ROOT / "d500").is_dir():  # (not a copy's toy)
        import compileall
        compileall.compile_dir(ROOT / "d500", quiet=1)
        # this machine's peak FLOP/s, while nothing else of the suite runs: its workers inherit
        # it (tests/helpers.seed_peak)
        import json

        from tests.helpers import measure_peak
        os.environ.setdefault("D500_TEST_PEAK", json.dumps(measure_peak()))


# Scheduling on pytest-xdist workers (`make test`: -n 2 --dist loadfile). A test file is one unit
# of work (its module fixtures built once), except that a test marked xdist_group("name") is a
# unit of its own with the others of its group: the node suite's modes, minutes each, would
# otherwise all run on one worker. Those units go first, then the files that mark a test slow or
# mpi (seconds to a minute each), then the rest, each part as xdist orders it (most tests first):
# xdist alone left the files of one to three tests for last, among them most of the long ones
# (MPI jobs, reproductions), and a worker takes its next unit while 2 tests of its own are still
# to run, so the pass could end on one worker running a minute of them while the other waited.
GROUP = "@"  # a nodeid's suffix naming its group, as xdist's own loadgroup writes it


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # the controller tells its workers (theirs says dist "no")
    node.workerinput["d500_groups"] = node.config.getoption("dist", "no") == "loadfile"


# `pytest -m serial` (make test's second pass) imports only the test files that mark a test
# serial: importing all of them (TensorFlow, JAX and torch among their imports, and pytest's
# assertion rewriting of each, never cached where PYTHONDONTWRITEBYTECODE is set) took 17 s of
# CPU to select its few tests, 1.5 s this way. A file marks one by writing `mark.serial`
# (`@pytest.mark.serial`, or in its `pytestmark`): every collection of the whole suite checks
# that no test is marked serial some other way, which this pass would not import.
SERIAL = "mark.serial"


def pytest_ignore_collect(collection_path, config):
    if (config.getoption("markexpr", "") == "serial" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and SERIAL not in collection_path.read_text()):
        return True
    return None


def _serial_marks_are_written(items) -> None:
    """Every test marked serial is in a file that writes `mark.serial` (see SERIAL)."""
    texts: dict = {}
    for item in items:
        if item.get_closest_marker("serial") is not None:
            if item.path not in texts:
                texts[item.path] = SERIAL in item.path.read_text()
            if not texts[item.path]:
                raise pytest.UsageError(f"{item.nodeid} is marked serial without '{SERIAL}' in "
                                        "its file: `pytest -m serial` would not import it")


@pytest.hookimpl(tryfirst=True)  # before -m deselects the serial tests
def pytest_collection_modifyitems(config, items):
    _serial_marks_are_written(items)
    if not getattr(config, "workerinput", {}).get("d500_groups"):
        return
    from _pytest.nodeid import coerce_node_id  # pytest 9's item id (xdist's loadgroup sets
    for item in items:  # _nodeid, which pytest 9 no longer reads)
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            item._id = coerce_node_id(f"{item.nodeid}{GROUP}{mark.args[0]}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", "no") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    heavy: dict[str, bool] = {}

    def is_heavy(unit: str) -> bool:  # a file that marks a test slow or mpi (read once)
        file = unit.split(GROUP, 1)[0]
        if file not in heavy:
            path = config.rootpath / file
            text = path.read_text() if path.is_file() else ""
            heavy[file] = "mark.slow" in text or "mark.mpi" in text
        return heavy[file]

    class GroupsFirst(OrderedDict):
        def popitem(self, last=True):
            key = None
            if not last:
                key = next((k for k in self if GROUP in k), None) \
                    or next((k for k in self if is_heavy(k)), None)
            return (key, self.pop(key)) if key is not None else super().popitem(last)

    class FilesAndGroups(LoadFileScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = GroupsFirst()

        def _split_scope(self, nodeid):
            file = nodeid.split("::", 1)[0]
            _, suffix, group = nodeid.rpartition(GROUP)
            grouped = suffix and "]" not in group and "::" not in group  # not a param's "@"
            return f"{file}{GROUP}{group}" if grouped else file

    return FilesAndGroups(config, log)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A results directory of the test's own ($D500_HOME: the ledger `Ledger()` opens, where a
    d500 command records its runs); tests/operators' and test_conformance's are autouse."""
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    return tmp_path / "home"
