"""The dataset files d500 reads, their published digests and where to get them; the one place a
file is found in a data directory and checked.

`REGISTRY` maps a dataset name to its `Spec`. Tests (which cannot have the real files) replace an
entry with one whose digests are those of generated files (`monkeypatch.setitem`).

Where each digest comes from (a digest is only as good as its publication):
- MNIST and Fashion-MNIST `.gz` files: the sha256 in TensorFlow Datasets' checksum files,
  `tensorflow_datasets/url_checksums/mnist.txt` and `fashion_mnist.txt` (with the byte sizes).
- MNIST unpacked IDX files: no official publication; the sha256 of the decompressed files as
  recorded, identically, in several independent public repositories (their sizes follow from
  the IDX header: 16 + 60000 * 784 bytes, ...). Fashion-MNIST has no such record, so its files
  are read from the `.gz` downloads only.
- `cifar-10-python.tar.gz`: the sha256 in Keras (`keras/src/datasets/cifar10.py`, `file_hash`)
  and torchvision's prototype datasets (`_builtin/cifar.py`), which agree.
- the extracted `cifar-10-batches-py/` files: torchvision publishes only their MD5
  (`torchvision/datasets/cifar.py`, `train_list`/`test_list`); those are checked.
- `wikitext-2-raw-v1.zip`, `wikitext-103-raw-v1.zip`: the sha256 and byte sizes in Hugging Face
  datasets' `datasets/wikitext/dataset_infos.json` (`download_checksums`). The unpacked
  `wiki.*.raw` files have no published sha256 (torchtext lists only their line counts), so
  WikiText is read from the zip alone (d500.training.data.corpora).
- TinyShakespeare's `input.txt`: the sha256 and size in TensorFlow Datasets'
  `tensorflow_datasets/datasets/tiny_shakespeare/checksums.tsv`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from d500.errors import DatasetError


@dataclass(frozen=True)
class File:
    """One file as published: its name in the dataset folder, its sha256 and byte size."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Unpacked:
    """The same content in unpacked form (a gunzipped IDX file, an extracted CIFAR batch):
    its path in the dataset folder and its published digest (`algorithm`: sha256 or md5)."""

    path: str
    algorithm: str
    digest: str


@dataclass(frozen=True)
class Spec:
    """A dataset that lives in files: where to download them and how to check them."""

    name: str
    homepage: str
    url_base: str  # the default download location: url_base + "/" + file name
    files: tuple[File, ...]
    # file name -> the unpacked forms the loader also accepts in its place
    unpacked: dict[str, tuple[Unpacked, ...]] = field(default_factory=dict)

    @property
    def url_env(self) -> str:
        """The environment variable that moves the download location, e.g. D500_MNIST_URL."""
        return "D500_" + self.name.upper().replace("-", "_") + "_URL"

    def file(self, name: str) -> File:
        return next(f for f in self.files if f.name == name)


def _idx(name: str, sha256: str, size: int) -> File:
    return File(f"{name}.gz", sha256, size)


MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# Decompressed MNIST files (see the module docstring for what this record is worth).
_MNIST_RAW = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
# torchvision/datasets/cifar.py: MD5 of the extracted batches.
_CIFAR_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}

REGISTRY: dict[str, Spec] = {
    "mnist": Spec(
        name="mnist",
        homepage="https://yann.lecun.com/exdb/mnist/",
        url_base="https://storage.googleapis.com/cvdf-datasets/mnist",
        # tensorflow_datasets/url_checksums/mnist.txt
        files=(
            _idx("train-images-idx3-ubyte",
                 "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
            _idx("train-labels-idx1-ubyte",
                 "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
            _idx("t10k-images-idx3-ubyte",
                 "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
            _idx("t10k-labels-idx1-ubyte",
                 "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
        ),
        unpacked={f"{name}.gz": (Unpacked(name, "sha256", digest),)
                  for name, digest in _MNIST_RAW.items()},
    ),
    "fashion-mnist": Spec(
        name="fashion-mnist",
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        url_base="http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
        # tensorflow_datasets/url_checksums/fashion_mnist.txt
        files=(
            _idx("train-images-idx3-ubyte",
                 "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84", 26421880),
            _idx("train-labels-idx1-ubyte",
                 "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845", 29515),
            _idx("t10k-images-idx3-ubyte",
                 "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073", 4422102),
            _idx("t10k-labels-idx1-ubyte",
                 "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5", 5148),
        ),
    ),
    "cifar10": Spec(
        name="cifar10",
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        url_base="https://www.cs.toronto.edu/~kriz",
        # keras/src/datasets/cifar10.py (file_hash); torchvision prototype _builtin/cifar.py
        files=(File("cifar-10-python.tar.gz",
                    "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                    170498071),),
        unpacked={"cifar-10-python.tar.gz": tuple(
            Unpacked(f"{CIFAR_FOLDER}/{name}", "md5", md5) for name, md5 in _CIFAR_MD5.items())},
    ),
}


_WIKITEXT = "https://s3.amazonaws.com/research.metamind.io/wikitext"
_HF = "https://huggingface.co/datasets/Salesforce/wikitext"
REGISTRY.update({
    # datasets/wikitext/dataset_infos.json (Hugging Face datasets), download_checksums
    "wikitext-2-raw": Spec(
        name="wikitext-2-raw", homepage=_HF, url_base=_WIKITEXT,
        files=(File("wikitext-2-raw-v1.zip",
                    "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
                    4721645),)),
    "wikitext-103-raw": Spec(
        name="wikitext-103-raw", homepage=_HF, url_base=_WIKITEXT,
        files=(File("wikitext-103-raw-v1.zip",
                    "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
                    191984949),)),
    # tensorflow_datasets/datasets/tiny_shakespeare/checksums.tsv
    "tinyshakespeare": Spec(
        name="tinyshakespeare", homepage="https://github.com/karpathy/char-rnn",
        url_base="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                 "tinyshakespeare",
        files=(File("input.txt",
                    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
                    1115394),)),
})


def spec(name: str) -> Spec:
    """The registered dataset of this name; an unknown one is a DatasetError listing them."""
    if name not in REGISTRY:
        raise DatasetError(f"unknown dataset '{name}' (file datasets: {', '.join(REGISTRY)})")
    return REGISTRY[name]


def folder(spec: Spec, root: str | Path) -> Path:
    """Where a dataset's files are under a data directory: DIR/NAME (what `d500 data download`
    writes) when it exists, else DIR itself (a folder holding just this dataset's files)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        named = os.environ.get("D500_DATA") or None  # --data DIR is checked as it is read
        source = "D500_DATA=" if named and Path(named).expanduser() == root else ""
        raise DatasetError(f"{source}{root}: " + ("a file, not a data directory" if root.exists()
                                                   else "the data directory does not exist"))
    sub = root / spec.name
    return sub if sub.is_dir() else root


def digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def how_to_get(spec: Spec, root: str | Path | None = None) -> str:
    to = root if root is not None else "DIR"
    return (f"get it with `d500 data download {spec.name} --to {to}` "
            f"or from {spec.url_base} ({spec.homepage})")


def check(path: Path, algorithm: str, expected: str, spec: Spec, root: Path) -> None:
    """A file whose digest is not the published one is a DatasetError naming both."""
    got = digest(path, algorithm)
    if got != expected:
        raise DatasetError(
            f"{path}: {algorithm} {got} is not the published {expected} of {spec.name}'s "
            f"{path.name} (a corrupt, partial or different file); {how_to_get(spec, root)}")


def check_size(spec: Spec, file: File, root: str | Path) -> None:
    """A published file of another size than the published one is a DatasetError naming both
    (the cheap look before a run: a corrupt or partial file was found only by the run's digest,
    which recorded the run failed and spent its seed)."""
    path = folder(spec, Path(root).expanduser()) / file.name
    if path.is_file() and path.stat().st_size != file.size:
        raise DatasetError(
            f"{path}: {path.stat().st_size:,} bytes, not the published {file.size:,} of "
            f"{spec.name}'s {file.name} (a corrupt, partial or different file); "
            f"{how_to_get(spec, root)}")


def resolve(spec: Spec, name: str, root: str | Path) -> Path:
    """The checked path of one published file under a data directory: the download itself, or
    an unpacked form the registry knows a digest for. A missing or wrong file is a one-line
    DatasetError naming the file, the expected digest and where to get it."""
    root = Path(root).expanduser()
    where = folder(spec, root)
    published = spec.file(name)
    path = where / published.name
    if path.is_file():
        check(path, "sha256", published.sha256, spec, root)
        return path
    forms = spec.unpacked.get(name, ())
    if any((where / form.path).is_file() for form in forms):
        for form in forms:
            if not (where / form.path).is_file():
                raise DatasetError(
                    f"{where / form.path}: missing beside the other unpacked files of "
                    f"{published.name}; expected {form.algorithm} {form.digest}; "
                    f"{how_to_get(spec, root)}")
            check(where / form.path, form.algorithm, form.digest, spec, root)
        return where / forms[0].path if len(forms) == 1 else where / Path(forms[0].path).parent
    also = ""
    if forms:
        unpacked = forms[0].path if len(forms) == 1 else f"{Path(forms[0].path).parent}/"
        also = f" (or the unpacked {unpacked})"
    raise DatasetError(
        f"{path}: missing; {spec.name} needs {published.name}{also} with sha256 "
        f"{published.sha256}; {how_to_get(spec, root)}")


def present(spec: Spec, name: str, root: str | Path) -> bool:
    """Whether a published file, or any of its unpacked forms, is under a data directory (no
    digest is computed: a cheap look before a run)."""
    where = folder(spec, root)
    forms = spec.unpacked.get(name, ())
    return (where / name).is_file() or any((where / f.path).is_file() for f in forms)


def provenance(spec: Spec, root: str | Path) -> dict[str, str]:
    """The files a load read, each with the published digest it matched ("sha256:<hex>" or
    "md5:<hex>"): the downloads where present, else their unpacked forms."""
    where, found = folder(spec, root), {}
    for file in spec.files:
        if (where / file.name).is_file():
            found[file.name] = f"sha256:{file.sha256}"
        else:
            for form in spec.unpacked.get(file.name, ()):
                found[form.path] = f"{form.algorithm}:{form.digest}"
    return found


def status(spec: Spec, name: str, root: str | Path) -> str:
    """One published file under a data directory: "ok", "ok (unpacked)", "missing" or "bad"
    (present with a wrong digest, or an incomplete set of unpacked files)."""
    try:
        path = resolve(spec, name, root)
    except DatasetError:
        return "bad" if present(spec, name, root) else "missing"
    return "ok" if path.name == name else "ok (unpacked)"


def data_dir(given: str | Path | None = None) -> Path | None:
    """The data directory: `given` (--data DIR), else $D500_DATA, else None."""
    value = given if given is not None else os.environ.get("D500_DATA") or None
    return Path(value).expanduser() if value is not None else None
