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
- any other file is compared byte for byte (sha256);
- a top-level Python file only submission.yaml names is compared under a name by its form.
Other edits (statements reordered around a call, code rewritten, a changed constant or
hyperparameter: `near_of` says so, never merges) make another digest: see the README's *What
the checks cannot prove*. No digest is stored: each comparison computes both sides from the
submission files kept under the ledger, so a ledger's old imports are compared by the rules of
the d500 reading them.
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
DYNAMIC = ("__file__", "importlib", "__import__", "runpy", "__spec__", "__loader__")


def digest(files: dict[str, bytes], numbers: bool = True) -> str:
    """The code's digest: each file by its path and its normal form (module docstring);
    `numbers=False`: every number in the Python files and submission.yaml counts as one."""
    python = {}
    for rel, data in files.items():
        if rel.endswith(".py"):
            try:
                python[rel] = data.decode()
            except UnicodeDecodeError:
                pass
    spec = _spec(files["submission.yaml"]) if "submission.yaml" in files else None
    named = _file_names(files, python, spec)
    spec = _refer(spec, named)
    keep: set[str] = set()
    for rel, data in files.items():
        if rel == "submission.yaml":
            keep |= code_form.words_of(_yaml_text(spec) if spec is not None
                                       else data.decode(errors="replace"))
        elif rel not in python:
            keep |= code_form.words_of(data.decode(errors="replace"))
    try:
        forms = code_form.forms({named.get(r, r): t for r, t in python.items()}, keep, numbers)
    except RecursionError:  # code nested too deep for the normal form: compared byte for byte
        forms = {}
    sha = hashlib.sha256()
    for rel in sorted(files, key=lambda r: named.get(r, r)):
        here = named.get(rel, rel)
        if here in forms:
            form = "py:" + forms[here]
        elif rel == "submission.yaml" and spec is not None:
            form = "yaml:" + _yaml_text(spec if numbers else _blank_numbers(spec))
        else:
            form = "bytes:" + hashlib.sha256(files[rel]).hexdigest()
        sha.update(f"{here}\0{form}\0".encode())
    return sha.hexdigest()


def _file_names(files: dict[str, bytes], python: dict[str, str], spec: dict | None
                ) -> dict[str, str]:
    """{path: /N.py} of the top-level Python files that only submission.yaml names: no other
    Python file has its stem as a name, no string or other file holds its path, no file
    imports by a computed name or reads `__file__`; numbered by their form alone (ties: by
    path)."""
    if spec is None or any(word in text for text in python.values() for word in DYNAMIC):
        return {}
    names = {rel: _names(text) for rel, text in python.items()}
    texts = [s for text in python.values() for s in _strings(text)] + [
        data.decode(errors="replace") for rel, data in files.items()
        if rel not in python and rel != "submission.yaml"]
    free = [rel for rel in python if "/" not in rel
            and not any(rel[:-3] in n for r, n in names.items() if r != rel)
            and not any(rel in t for t in texts)
            and rel not in _yaml_text(_refer(spec, {rel: "/"}))]
    if len(free) > 1:  # in one order: by each file's form alone
        keep = code_form.words_of(_yaml_text(_refer(spec, {r: "/" for r in free})))
        form = {r: code_form.forms({"m.py": python[r]}, keep).get("m.py", "") for r in free}
        free.sort(key=lambda r: (form[r], r))
    return {rel: f"/{i}.py" for i, rel in enumerate(free)}


def _names(text: str) -> set[str]:
    """The identifiers a Python file uses (its text's words when it does not parse)."""
    import ast
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return code_form.words_of(text)
    out: set[str] = set()
    for n in ast.walk(tree):
        for v in (getattr(n, "id", None), getattr(n, "attr", None), getattr(n, "name", None),
                  getattr(n, "arg", None), getattr(n, "module", None),
                  getattr(n, "asname", None)):
            if isinstance(v, str):
                out |= set(v.split("."))
    return out


def _strings(text: str) -> list[str]:
    """A Python file's strings (its text when it does not parse)."""
    import ast
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return [text]
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _refer(spec: Any, named: dict[str, str]) -> Any:
    """submission.yaml with each reference to a renamed file ('FILE.py' or 'FILE.py:Name')
    renamed too."""
    if isinstance(spec, dict):
        return {k: _refer(v, named) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_refer(v, named) for v in spec]
    if isinstance(spec, str):
        for rel, new in named.items():
            if spec == rel or spec.startswith(rel + ":"):
                return new + spec[len(rel):]
    return spec


def python_form(source: str, keep: set[str] = frozenset()) -> str:
    """One Python file's normal form, as a package of that file alone whose other files name
    `keep` (code_form)."""
    return code_form.forms({"m.py": source}, set(keep))["m.py"]


def _spec(data: bytes) -> dict | None:
    """submission.yaml without what does not change training (None: not a YAML mapping)."""
    try:
        spec = yaml.safe_load(data)
    except yaml.YAMLError:
        return None
    if not isinstance(spec, dict):
        return None
    return {str(k): v for k, v in spec.items() if k not in NOT_TRAINING}


def _yaml_text(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


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
