"""The suite's own xdist scheduling (tests/conftest.py), run on a toy suite with the real
conftest: a file is one unit of work, a test marked xdist_group is a unit of its own, and those
units go first, spread over the workers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
GROUPED = '''
import pytest


@pytest.mark.parametrize("n", [pytest.param(n, marks=pytest.mark.xdist_group(f"part-{n}"))
                               for n in range(3)])
def test_part(n):
    pass


def test_plain():
    pass
'''
MANY = "".join(f"def test_{k}():\n    pass\n\n\n" for k in range(6))
HEAVY = "import pytest\n\n\n@pytest.mark.slow\ndef test_long():\n    pass\n"


def _toy(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "tests" / "test_many.py").write_text(MANY)
    (tmp_path / "tests" / "test_heavy.py").write_text(HEAVY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n")
    return tmp_path


def _pytest(folder: Path, *args: str) -> list[tuple[str, str]]:
    """(worker, node id) of every passed test in the order they finished."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                             *args, "tests"], cwd=folder, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    xdist = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", result.stdout, re.M)
    return xdist or [("", node) for node in re.findall(r"^(\S+) PASSED", result.stdout, re.M)]


def test_groups_are_units_of_their_own_run_first_on_both_workers(tmp_path):
    done = _pytest(_toy(tmp_path), "-n", "2", "--dist", "loadfile")
    assert len(done) == 11
    parts = {node: worker for worker, node in done if "test_part" in node}
    assert sorted(parts) == [f"tests/test_grouped.py::test_part[{n}]@part-{n}" for n in range(3)]
    assert set(parts.values()) == {"gw0", "gw1"}  # the file's groups shared by the workers
    for worker in ("gw0", "gw1"):  # each worker's first unit was a group
        assert next(node for w, node in done if w == worker) in parts
    many = {worker for worker, node in done if "test_many" in node}
    assert len(many) == 1  # an ungrouped file stays on one worker (its module fixtures: once)


def test_a_file_that_marks_a_test_slow_goes_after_the_groups_before_the_other_files(tmp_path):
    """xdist alone orders files by their number of tests, most first: the one-test file that
    marks its test slow would go last, and a long test there ends the pass on one worker."""
    done = [node for _, node in _pytest(_toy(tmp_path), "-n", "1", "--dist", "loadfile")]
    assert [n.split("::")[0] for n in done[3:]] == ["tests/test_heavy.py", *["tests/test_many.py"]
                                                    * 6, "tests/test_grouped.py"], done
    assert all("test_part" in n for n in done[:3]), done


def test_without_xdist_node_ids_are_plain(tmp_path):
    done = _pytest(_toy(tmp_path))
    assert len(done) == 11 and not any("@" in node for _, node in done)
