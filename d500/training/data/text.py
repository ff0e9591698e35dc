"""The shipped text corpus `python-stdlib`: the 168 top-level modules of CPython 3.11.7's standard
library (Lib/*.py), one document each, read with the standard library alone and checked against
its recorded sha256.

Why this corpus: every machine that runs d500 has a Python, but not the same one, so the text is
shipped rather than read from the local install; the PSF licence allows redistribution (its text
is `PYTHON-LICENSE.txt` beside it); 4.7 MB of real, varied text (code, comments, docstrings) is
far more than a small model memorises, and 168 documents split by document, never by line.

`python-stdlib.jsonl.xz` holds one JSON object per line, {"name": "argparse.py", "text": ...}, in
name order; `build(stdlib)` wrote it from a CPython 3.11.7 install (`python -c "from
d500.training.data import text; text.build('/path/to/lib/python3.11', 'out.jsonl.xz')"`).
"""

from __future__ import annotations

import hashlib
import json
import lzma
from importlib import resources
from pathlib import Path

from d500.errors import DatasetError

NAME = "python-stdlib"
FILE = "python-stdlib.jsonl.xz"
LICENSE = "PYTHON-LICENSE.txt"
SHA256 = "4c0b3cb452c26d570f20ff7e3c67835255df93ee70efcffa2913d20282702e24"
DOCUMENTS = 168


def path() -> Path:
    """The shipped corpus file."""
    return Path(str(resources.files(__package__).joinpath(FILE)))


def checked(file: Path | None = None) -> bytes:
    """The corpus file's bytes after its sha256 is checked: a missing or edited file is a
    one-line DatasetError naming it."""
    file = file or path()
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise DatasetError(f"{file}: cannot read the {NAME} corpus ({err.strerror})") from err
    got = hashlib.sha256(raw).hexdigest()
    if got != SHA256:
        raise DatasetError(f"{file}: sha256 {got} is not the recorded {SHA256} of the {NAME} "
                           f"corpus (an edited or different file); reinstall d500")
    return raw


def documents(file: Path | None = None) -> list[tuple[str, str]]:
    """The corpus as (name, text) pairs in name order, its sha256 checked first."""
    raw = checked(file)
    rows = [json.loads(line) for line in lzma.decompress(raw).decode("utf-8").splitlines()]
    return [(row["name"], row["text"]) for row in rows]


def build(stdlib: str | Path, out: str | Path) -> str:
    """Write the corpus from a CPython install's Lib folder (every top-level *.py, by name, read
    as UTF-8); returns the file's sha256 (to be recorded as SHA256 above)."""
    files = sorted(Path(stdlib).glob("*.py"), key=lambda p: p.name)
    lines = [json.dumps({"name": p.name, "text": p.read_text("utf-8")}, ensure_ascii=False)
             for p in files]
    data = lzma.compress(("\n".join(lines) + "\n").encode("utf-8"),
                         preset=9 | lzma.PRESET_EXTREME)
    Path(out).write_bytes(data)
    return hashlib.sha256(data).hexdigest()
