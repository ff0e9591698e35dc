"""MNIST, Fashion-MNIST and CIFAR-10 loaders on generated files of the real formats (IDX headers
and magic numbers; pickled batch dicts in a .tar.gz), with the registry's digests replaced by
those of the generated files; plus the helpers the other data tests share."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from d500.errors import DatasetError
from d500.training import data
from d500.training.data import cifar, idx, registry

# ------------------------------------------------------------------ helpers (imported elsewhere)


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 0x0000 08 <ndim>, big-endian sizes, the values."""
    array = np.ascontiguousarray(array, np.uint8)
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write(path: Path, raw: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)
    return path


def make_idx(folder: Path, n_train: int = 60, n_test: int = 20, seed: int = 0,
             gz: bool = True) -> dict[str, np.ndarray]:
    """The four MNIST-format files (28x28 images, labels 0..9) in `folder`; returns the arrays."""
    rng = np.random.default_rng(seed)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, np.uint8)}
    for name, array in arrays.items():
        write(folder / (f"{name}.gz" if gz else name), idx_bytes(array))
    return arrays


class _Python2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Pickles bytes and (ASCII) text the way Python 2's cPickle pickled `str`
    (SHORT_BINSTRING/BINSTRING), as in the CIFAR-10 python release; Python 3's protocol 2 would
    call _codecs.encode instead."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    def save_py2_ascii(self, obj: str) -> None:  # NumPy's dtype arguments ('u1', '|')
        self.save_py2_str(obj.encode("ascii"))

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_ascii


def cifar_batch(images: np.ndarray, labels: np.ndarray, label: bytes) -> bytes:
    """A batch as the CIFAR-10 python release pickles it: protocol 2 from Python 2, str keys
    (bytes in Python 3), the array rebuilt by numpy.core.multiarray._reconstruct."""
    out = io.BytesIO()
    _Python2Pickler(out, protocol=2).dump(
        {b"batch_label": label, b"labels": [int(v) for v in labels],
         b"data": np.ascontiguousarray(images.reshape(len(images), -1)),
         b"filenames": [b"img_%d.png" % i for i in range(len(images))]})
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def make_cifar(folder: Path, per_batch: int = 8, seed: int = 0, extracted: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """cifar-10-python.tar.gz (or its extracted cifar-10-batches-py/) with 5 training batches and
    a test batch of `per_batch` images each; returns (x_train, y_train, x_test, y_test)."""
    rng = np.random.default_rng(seed)
    batches = {}
    for name in (*registry.CIFAR_TRAIN, registry.CIFAR_TEST):
        x = rng.integers(0, 256, (per_batch, 3, 32, 32), np.uint8)
        y = rng.integers(0, 10, per_batch)
        batches[name] = (x, y, cifar_batch(x, y, name.encode()))
    members = {f"{registry.CIFAR_FOLDER}/{name}": raw for name, (_, _, raw) in batches.items()}
    members[f"{registry.CIFAR_FOLDER}/batches.meta"] = pickle.dumps(
        {b"label_names": [b"airplane"] * 10}, protocol=2)
    folder.mkdir(parents=True, exist_ok=True)
    if extracted:
        for name, raw in members.items():
            write(folder / name, raw)
    else:
        with tarfile.open(folder / cifar.ARCHIVE, "w:gz") as tar:
            for name, raw in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
    x_train = np.concatenate([batches[n][0] for n in registry.CIFAR_TRAIN])
    y_train = np.concatenate([batches[n][1] for n in registry.CIFAR_TRAIN])
    return x_train, y_train, batches[registry.CIFAR_TEST][0], batches[registry.CIFAR_TEST][1]


def adopt(monkeypatch: pytest.MonkeyPatch, name: str, folder: Path) -> registry.Spec:
    """Replace the registry's digests (and sizes) of dataset `name` by those of the files in
    `folder`, as if they were the published release."""
    spec = registry.REGISTRY[name]
    files = tuple(
        dataclasses.replace(f, sha256=registry.digest(folder / f.name),
                            size=(folder / f.name).stat().st_size)
        if (folder / f.name).is_file() else f for f in spec.files)
    unpacked = {key: tuple(dataclasses.replace(u, digest=registry.digest(folder / u.path,
                                                                         u.algorithm))
                           if (folder / u.path).is_file() else u for u in forms)
                for key, forms in spec.unpacked.items()}
    new = dataclasses.replace(spec, files=files, unpacked=unpacked)
    monkeypatch.setitem(registry.REGISTRY, name, new)
    return new


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch):
    monkeypatch.delenv("D500_DATA", raising=False)


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------ MNIST and Fashion-MNIST

@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loader_reads_gzipped_files(tmp_path, monkeypatch, name):
    arrays = make_idx(tmp_path / name, seed=3)
    adopt(monkeypatch, name, tmp_path / name)
    ds = data.load(name, tmp_path)
    assert ds.name == name and ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    assert ds.x.dtype == np.uint8 and ds.y.dtype == np.int64
    np.testing.assert_array_equal(ds.x[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.test_x[:, 0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
    assert ds.normalization == "scale" and ds.scale == 255.0
    spec = registry.REGISTRY[name]
    assert ds.files == {f.name: f"sha256:{registry.digest(tmp_path / name / f.name)}"
                        for f in spec.files}


def test_mnist_reads_unpacked_files_and_a_folder_of_its_own(tmp_path, monkeypatch):
    arrays = make_idx(tmp_path, gz=False, seed=4)  # DIR itself holds the files
    adopt(monkeypatch, "mnist", tmp_path)
    ds = data.load("mnist", tmp_path)
    np.testing.assert_array_equal(ds.x[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
    assert ds.files == {n: f"sha256:{registry.digest(tmp_path / n)}" for n in arrays}


def test_fashion_mnist_has_no_published_digest_for_unpacked_files(tmp_path):
    make_idx(tmp_path / "fashion-mnist", gz=False)
    with pytest.raises(DatasetError) as err:
        data.load("fashion-mnist", tmp_path)
    text = one_line(err)
    assert "train-images-idx3-ubyte.gz: missing" in text
    assert registry.REGISTRY["fashion-mnist"].files[0].sha256 in text
    assert "d500 data download fashion-mnist" in text


def test_missing_file_says_what_and_where_to_get_it(tmp_path, monkeypatch):
    make_idx(tmp_path / "mnist")
    adopt(monkeypatch, "mnist", tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError) as err:
        data.load("mnist", tmp_path)
    text = one_line(err)
    assert str(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz") in text and "missing" in text
    assert registry.REGISTRY["mnist"].file("t10k-labels-idx1-ubyte.gz").sha256 in text
    assert f"d500 data download mnist --to {tmp_path}" in text
    assert registry.REGISTRY["mnist"].url_base in text


def test_files_not_matching_the_published_digest_are_refused(tmp_path):
    make_idx(tmp_path / "mnist")  # generated files against the real published digests
    with pytest.raises(DatasetError) as err:
        data.load("mnist", tmp_path)
    text = one_line(err)
    published = registry.REGISTRY["mnist"].file("train-images-idx3-ubyte.gz").sha256
    assert "train-images-idx3-ubyte.gz: sha256" in text and f"published {published}" in text
    assert "d500 data download mnist" in text


def test_truncated_gzip_fails_its_digest(tmp_path, monkeypatch):
    make_idx(tmp_path / "mnist")
    adopt(monkeypatch, "mnist", tmp_path / "mnist")
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DatasetError, match="is not the published"):
        data.load("mnist", tmp_path)


def test_truncated_files_with_matching_digests_fail_their_format(tmp_path, monkeypatch):
    # The digest cannot catch a file that was published truncated; the format check does.
    folder = tmp_path / "mnist"
    make_idx(folder)
    gz = folder / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-100])
    adopt(monkeypatch, "mnist", folder)
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte.gz: cannot read it"):
        data.load("mnist", tmp_path)
    raw = folder / "t10k-images-idx3-ubyte"
    raw.write_bytes(idx_bytes(np.zeros((20, 28, 28), np.uint8))[:-28])
    with pytest.raises(DatasetError) as err:
        idx.read(raw, 3)
    assert "15668 bytes where its IDX header [20, 28, 28] needs 15696 (truncated)" in one_line(err)


def test_wrong_magic_and_mismatched_counts(tmp_path, monkeypatch):
    folder = tmp_path / "mnist"
    arrays = make_idx(folder)
    write(folder / "train-images-idx3-ubyte.gz", idx_bytes(arrays["train-labels-idx1-ubyte"]))
    adopt(monkeypatch, "mnist", folder)
    with pytest.raises(DatasetError, match="magic number 0x00000801, expected 0x00000803"):
        data.load("mnist", tmp_path)
    write(folder / "train-images-idx3-ubyte.gz", idx_bytes(arrays["train-images-idx3-ubyte"]))
    write(folder / "train-labels-idx1-ubyte.gz", idx_bytes(arrays["train-labels-idx1-ubyte"][:7]))
    adopt(monkeypatch, "mnist", folder)
    with pytest.raises(DatasetError, match="7 labels for the 60 images"):
        data.load("mnist", tmp_path)
    write(folder / "train-labels-idx1-ubyte.gz", idx_bytes(np.full(60, 12, np.uint8)))
    adopt(monkeypatch, "mnist", folder)
    with pytest.raises(DatasetError, match="label 12 outside 0..9"):
        data.load("mnist", tmp_path)


def test_file_datasets_need_a_data_directory(tmp_path, monkeypatch):
    with pytest.raises(DatasetError) as err:
        data.load("mnist")
    assert "--data DIR or set D500_DATA" in one_line(err)
    make_idx(tmp_path / "mnist")
    adopt(monkeypatch, "mnist", tmp_path / "mnist")
    monkeypatch.setenv("D500_DATA", str(tmp_path))
    assert len(data.load("mnist").y) == 60
    with pytest.raises(DatasetError, match="does not exist"):
        data.load("mnist", tmp_path / "nowhere")


# ------------------------------------------------------------------ CIFAR-10

@pytest.mark.parametrize("extracted", [False, True])
def test_cifar_reads_the_archive_or_its_extracted_folder(tmp_path, monkeypatch, extracted):
    x, y, tx, ty = make_cifar(tmp_path / "cifar10", extracted=extracted, seed=5)
    adopt(monkeypatch, "cifar10", tmp_path / "cifar10")
    ds = data.load("cifar10", tmp_path)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    np.testing.assert_array_equal(ds.x, x)
    np.testing.assert_array_equal(ds.y, y)
    np.testing.assert_array_equal(ds.test_x, tx)
    np.testing.assert_array_equal(ds.test_y, ty)
    assert ds.normalization == "standardize"
    assert len(ds.files) == (6 if extracted else 1)
    assert all(v.startswith("md5:" if extracted else "sha256:") for v in ds.files.values())


def test_cifar_channel_layout_is_the_release_layout(tmp_path, monkeypatch):
    # The release stores 1024 red values, then green, then blue, each row-major.
    make_cifar(tmp_path, per_batch=1)
    flat = np.arange(3072, dtype=np.int64) % 251
    raw = cifar_batch(flat.astype(np.uint8)[None], np.array([3]), b"b")
    images, labels = cifar.read_batch(raw, "batch")
    assert images.shape == (1, 3, 32, 32) and labels.tolist() == [3]
    assert images[0, 1, 0, 0] == flat[1024] and images[0, 2, 31, 31] == flat[3071]
    assert images[0, 0, 1, 0] == flat[32]


def test_cifar_wrong_truncated_or_incomplete_files(tmp_path, monkeypatch):
    folder = tmp_path / "cifar10"
    make_cifar(folder)
    with pytest.raises(DatasetError) as err:  # real published digest
        data.load("cifar10", tmp_path)
    assert "cifar-10-python.tar.gz: sha256" in one_line(err)
    archive = folder / cifar.ARCHIVE
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    adopt(monkeypatch, "cifar10", folder)
    with pytest.raises(DatasetError) as err:
        data.load("cifar10", tmp_path)
    assert "cannot read it as a .tar.gz" in one_line(err)
    archive.unlink()
    make_cifar(folder, extracted=True)
    adopt(monkeypatch, "cifar10", folder)
    (folder / registry.CIFAR_FOLDER / "data_batch_3").unlink()
    with pytest.raises(DatasetError) as err:
        data.load("cifar10", tmp_path)
    assert "data_batch_3: missing beside the other unpacked files" in one_line(err)


def test_cifar_extracted_batches_are_checked_by_md5(tmp_path, monkeypatch):
    folder = tmp_path / "cifar10"
    make_cifar(folder, extracted=True)
    adopt(monkeypatch, "cifar10", folder)
    batch = folder / registry.CIFAR_FOLDER / "test_batch"
    batch.write_bytes(batch.read_bytes()[:-10])
    with pytest.raises(DatasetError) as err:
        data.load("cifar10", tmp_path)
    text = one_line(err)
    assert "test_batch: md5" in text and hashlib.md5(batch.read_bytes()).hexdigest() in text


def test_cifar_pickles_cannot_run_code(tmp_path, monkeypatch):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(DatasetError, match="global builtins.print is not allowed"):
        cifar.read_batch(pickle.dumps({b"data": Evil()}, protocol=4), "evil")
    with pytest.raises(DatasetError, match=r"b'data' is list"):
        cifar.read_batch(pickle.dumps({b"data": [1], b"labels": [1]}, protocol=4), "odd")
    with pytest.raises(DatasetError, match="not a CIFAR-10 python batch"):
        cifar.read_batch(b"\x80\x02}q\x00", "cut")


# ------------------------------------------------------------------ before a run

def test_check_present_looks_without_hashing(tmp_path, monkeypatch):
    from d500.training.data.dataset import check_present
    check_present("digits")
    with pytest.raises(DatasetError, match="give --data DIR or set D500_DATA"):
        check_present("cifar10")
    make_idx(tmp_path / "mnist")
    adopt(monkeypatch, "mnist", tmp_path / "mnist")
    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-1] + b"?")  # a wrong digest: load() finds it
    monkeypatch.setattr(registry, "digest", lambda *a: pytest.fail("hashed a file"))
    check_present("mnist", tmp_path)
    # a file of another size than the published one: said here (a run found it, recorded
    # itself failed and spent its seed)
    images.write_bytes(b"garbage\n")
    with pytest.raises(DatasetError) as err:
        check_present("mnist", tmp_path)
    size = registry.REGISTRY["mnist"].file("train-images-idx3-ubyte.gz").size
    assert f"train-images-idx3-ubyte.gz: 8 bytes, not the published {size:,} of mnist's" \
        in one_line(err)
    images.unlink()
    with pytest.raises(DatasetError) as err:
        check_present("mnist", tmp_path)
    assert "train-images-idx3-ubyte.gz: missing" in one_line(err)


def test_shapes_known_before_loading_match_the_data(tmp_path, monkeypatch):
    from d500 import builders
    from d500.training.data.dataset import shape_of
    assert shape_of("digits") == (data.load("digits").input_shape, 10)
    make_idx(tmp_path / "fashion-mnist")
    adopt(monkeypatch, "fashion-mnist", tmp_path / "fashion-mnist")
    assert shape_of("fashion-mnist") == (data.load("fashion-mnist", tmp_path).input_shape, 10)
    make_cifar(tmp_path / "cifar10", per_batch=2)
    adopt(monkeypatch, "cifar10", tmp_path / "cifar10")
    assert shape_of("cifar10") == (data.load("cifar10", tmp_path).input_shape, 10)
    assert shape_of("mnist")[0] == builders.SHAPES["mnist"]
    assert shape_of("cifar10")[0] == builders.SHAPES["cifar"]
    with pytest.raises(DatasetError, match="unknown dataset 'svhn'"):
        shape_of("svhn")
