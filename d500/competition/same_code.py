"""One entry's code under several names: a digest of a submission's files that a trivial edit
does not change, and which imported package's entry a package's code already is.

    from d500.competition import same_code
    same_code.digest({"submission.yaml": b"...", "opt.py": b"..."})  # hex digest
    same_code.first_of(ledger, pkg)   # Copy(entry, sha256) of the first package imported with
                                      # this code under another entry name, or None
    same_code.copies(ledger)          # {package sha256: Copy} of every such later package

"The same code": the same files by path, where
- `submission.yaml` is read as YAML and compared without what does not change training (its
  `name`, `description`, `authors` and `workloads`);
- the Python files are compared as their normal form (d500.competition.code_form: the syntax
  tree without comments, docstrings and dead code, the names the package binds itself and
  nothing else can name renamed, its definitions in one order), read together: a name another
  file, a string or submission.yaml names keeps its name;
- any other file is compared byte for byte (sha256).
Other edits (a renamed file, statements reordered inside a function, a changed constant or
hyperparameter) make another digest: see the README's *What the checks cannot prove*.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from d500.competition import code_form

NOT_TRAINING = ("name", "description", "authors", "workloads")  # submission.yaml keys dropped


def digest(files: dict[str, bytes], numbers: bool = True) -> str:
    """The code's digest: each file by its path and its normal form (module docstring);
    `numbers=False`: every number in the Python files and submission.yaml counts as one."""
    python = {}
    keep: set[str] = set()
    for rel, data in files.items():
        if rel.endswith(".py"):
            try:
                python[rel] = data.decode()
            except UnicodeDecodeError:
                pass
        elif rel == "submission.yaml":
            keep |= code_form.words_of(_yaml_form(data) or data.decode(errors="replace"))
        else:
            keep |= code_form.words_of(data.decode(errors="replace"))
    forms = code_form.forms(python, keep, numbers)
    sha = hashlib.sha256()
    for rel in sorted(files):
        form = ("py:" + forms[rel]) if rel in forms else _form(rel, files[rel], numbers)
        sha.update(f"{rel}\0{form}\0".encode())
    return sha.hexdigest()


def python_form(source: str, keep: set[str] = frozenset()) -> str:
    """One Python file's normal form, as a package of that file alone whose other files name
    `keep` (code_form)."""
    return code_form.forms({"m.py": source}, set(keep))["m.py"]


def _yaml_form(data: bytes, numbers: bool = True) -> str | None:
    try:
        spec = yaml.safe_load(data)
    except yaml.YAMLError:
        return None
    if not isinstance(spec, dict):
        return None
    kept = {str(k): v for k, v in spec.items() if k not in NOT_TRAINING}
    return json.dumps(kept if numbers else _blank_numbers(kept), sort_keys=True, default=str)


def _blank_numbers(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return "#number"
    if isinstance(value, dict):
        return {k: _blank_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_numbers(v) for v in value]
    return value


def _form(rel: str, data: bytes, numbers: bool = True) -> str:
    if rel == "submission.yaml" and (form := _yaml_form(data, numbers)) is not None:
        return "yaml:" + form
    return "bytes:" + hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------ packages in a ledger

@dataclass(frozen=True)
class Copy:
    """The package whose code another one's is: its entry name and sha256."""

    entry: str
    sha256: str


def folder_files(folder: Path) -> dict[str, bytes] | None:
    """{path: bytes} of an extracted package's submission folder (None: not there)."""
    if not folder.is_dir():
        return None
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def imported(ledger: Any, numbers: bool = True) -> list[tuple[str, str, str]]:
    """(entry, package sha256, code digest) of every package imported whose submission files
    are still where the import put them: those imported whole oldest first, then the forced
    ones oldest first (a forced package is never the first of its code while a whole one of
    it is there: else an honest copy imported after it ranked nowhere)."""
    from d500.ledger.imports import package_folder
    out = []
    for p in sorted(ledger.packages(), key=lambda p: bool(p["forced"])):  # (stable)
        files = folder_files(package_folder(ledger, p["sha256"]) / "files" / "submission")
        if files:
            out.append((p["entry"], p["sha256"], digest(files, numbers)))
    return out


def copies(ledger: Any) -> dict[str, Copy]:
    """{package sha256: the first imported package of its code under another entry name} for
    every package whose code an earlier-imported entry of another name already is."""
    first: dict[str, Copy] = {}
    out = {}
    for entry, sha, code in imported(ledger):
        original = first.setdefault(code, Copy(entry, sha))
        if original.entry != entry:
            out[sha] = original
    return out


def first_of(ledger: Any, pkg: Any) -> Copy | None:
    """The first package imported into `ledger` whose code `pkg`'s is, when its entry has
    another name (None: none has this code, or the first was this entry's)."""
    entry = str(pkg.manifest.get("entry", ""))
    code = digest(pkg.submission_files())
    first = next((Copy(e, sha) for e, sha, c in imported(ledger) if c == code), None)
    return first if first is not None and first.entry != entry else None


def near_of(ledger: Any, pkg: Any) -> Copy | None:
    """The first package imported into `ledger`, of another entry name, whose code `pkg`'s is
    but for its numbers (None: none, or its code is that package's: `first_of`)."""
    entry = str(pkg.manifest.get("entry", ""))
    files = pkg.submission_files()
    code, near = digest(files), digest(files, numbers=False)
    exact = {c for _, _, c in imported(ledger)}
    first = next((Copy(e, sha) for e, sha, c in imported(ledger, numbers=False) if c == near),
                 None)
    return None if first is None or first.entry == entry or code in exact else first


def line(entry: str, copy: Copy) -> str:
    """The one line check and import say."""
    return (f"entry {entry}'s code is entry {copy.entry}'s (package {copy.sha256[:12]}, "
            f"imported first; the same files up to the names it binds itself, the order of its "
            f"definitions, dead code, comments and docstrings): on the boards they are one "
            f"entry, ranked as {copy.entry}; {entry}'s rows are listed after it, unranked")


def near_line(entry: str, copy: Copy) -> str:
    """The one line check says of code that is another entry's but for its numbers."""
    return (f"entry {entry}'s code is entry {copy.entry}'s but for its numbers (package "
            f"{copy.sha256[:12]}, imported first): another recipe, ranked apart; whether a "
            f"constant or hyperparameter was nudged to pass as another entry is a person's call")
