"""The embedded default dataset: scikit-learn's digits, shipped in d500 and read without
scikit-learn; and `load()`'s dispatch by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d500.errors import DatasetError
from d500.training import data
from d500.training.data import digits


def test_digits_equal_scikit_learns_exactly():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    reference = sklearn_datasets.load_digits()
    ds = data.load("digits")
    assert ds.name == "digits" and ds.num_classes == 10 and ds.input_shape == (1, 8, 8)
    assert ds.x.shape == (1797, 1, 8, 8) and ds.x.dtype == np.uint8
    np.testing.assert_array_equal(ds.x.reshape(1797, 64), reference.data)
    np.testing.assert_array_equal(ds.x[:, 0], reference.images)
    np.testing.assert_array_equal(ds.y, reference.target)
    assert ds.y.dtype == np.int64 and not ds.has_official_test
    assert (ds.normalization, ds.scale) == ("scale", 16.0)
    shipped = Path(sklearn_datasets.__file__).parent / "data" / digits.FILE
    assert digits.raw_bytes() == shipped.read_bytes()  # a byte-for-byte copy
    assert ds.files == {digits.FILE: f"sha256:{digits.sha256()}"}


def test_digits_load_without_scikit_learn():
    code = ("import sys; sys.modules['sklearn'] = None\n"  # any import of it would fail
            "from d500.training import data\n"
            "ds = data.load('digits'); print(len(ds.y), int(ds.x.max()), "
            "'sklearn' in sys.modules and sys.modules['sklearn'] is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["1797", "16", "False"]


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(DatasetError) as err:
        data.load("imagenet")
    assert str(err.value) == ("unknown dataset 'imagenet' (known: digits, mnist, fashion-mnist, "
                              "cifar10)")


@pytest.mark.slow
def test_digits_ship_in_the_wheel(tmp_path):
    """Build the wheel from a copy of the package and load digits from the unpacked wheel."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    shutil.copytree(root / "d500", src / "d500", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", str(src), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300, cwd=src)
    (wheel,) = (tmp_path / "dist").glob("d500-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert "d500/training/data/digits.csv.gz" in z.namelist()
        z.extractall(tmp_path / "site")
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "import d500; from d500.training import data\n"
            "print(d500.__file__); print(len(data.load('digits').y))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin"})
    origin, count = out.stdout.split()
    assert origin.startswith(str(tmp_path / "site")) and count == "1797"
