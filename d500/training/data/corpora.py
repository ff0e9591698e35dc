"""The text corpora users bring (`--data DIR`): WikiText-2 and WikiText-103 raw, and
TinyShakespeare, each file checked against its published sha256 (d500.training.data.registry)
and cut into documents, so that a language model's splits are by document, never by line.

- WikiText (Merity et al. 2016, CC BY-SA): the published zip, read in place. Its documents are
  the Wikipedia articles, each starting at a top-level heading line " = Title = "; its own
  train, valid and test files are the splits (already by article: WikiText-2 has 600, 60 and 60
  articles). A workload takes the first N articles of each.
- TinyShakespeare (Karpathy's char-rnn `input.txt`): one file; its documents are the speeches
  (a speaker's line and what follows, up to a blank line), split by the workload's seeded
  permutation as the shipped corpus is (d500.training.data.lm.document_split).

    documents("wikitext-2-raw", root)   # {"train": [(title, text)...], "validation": ..., ...}
    documents("tinyshakespeare", root)  # {"all": [("1: First Citizen", "First Citizen:\\n...")]}

Where the digests come from: registry.py's docstring.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from d500.errors import DatasetError
from d500.training.data import registry

WIKITEXT = {"wikitext-2-raw": "wikitext-2-raw", "wikitext-103-raw": "wikitext-103-raw"}
SHAKESPEARE = "tinyshakespeare"
NAMES = (*WIKITEXT, SHAKESPEARE)
# WikiText's split files inside its zip, as the workload's parts name them
WIKI_PARTS = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
_TITLE = re.compile(r"^ = [^=].* = $")  # " = Title = ": an article starts ("= = x = =": a section)

Documents = list[tuple[str, str]]


def path(name: str, root: str | Path | None) -> Path:
    """The corpus file under the data directory, its sha256 checked: a missing or wrong file is
    one line naming it, the published digest and where to get it."""
    spec = registry.spec(name)
    where = registry.data_dir(root)
    if where is None:
        raise DatasetError(f"text corpus '{name}' is read from files: give --data DIR or set "
                           f"D500_DATA; {registry.how_to_get(spec)}")
    return registry.resolve(spec, spec.files[0].name, where)


def files(name: str, root: str | Path | None) -> dict[str, str]:
    """{file name: "sha256:<hex>"} of a corpus after its file is checked."""
    spec = registry.spec(name)
    return {path(name, root).name: f"sha256:{spec.files[0].sha256}"}


def articles(text: str) -> Documents:
    """WikiText's articles: (title, text) from each top-level heading to the next."""
    found: Documents = []
    title, lines = None, []
    for line in text.splitlines(keepends=True):
        if _TITLE.match(line.rstrip("\n")):
            if title is not None:
                found.append((title, "".join(lines)))
            title, lines = line.strip(" =\n"), []
        if title is not None:
            lines.append(line)
    if title is not None:
        found.append((title, "".join(lines)))
    return found


def speeches(text: str) -> Documents:
    """TinyShakespeare's speeches: blocks between blank lines, named by number and speaker."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    return [(f"{i}: {b.splitlines()[0].rstrip(':')}", b + "\n") for i, b in enumerate(blocks, 1)]


def documents(name: str, root: str | Path | None) -> dict[str, Documents]:
    """The corpus's documents: WikiText's by its own split files ({"train", "validation",
    "test"}), TinyShakespeare's as {"all": ...} (the workload's permutation splits them)."""
    file = path(name, root)
    if name == SHAKESPEARE:
        return {"all": speeches(file.read_text("utf-8"))}
    if name not in WIKITEXT:
        raise DatasetError(f"unknown text corpus '{name}' (from files: {', '.join(NAMES)})")
    folder = WIKITEXT[name]
    out = {}
    with zipfile.ZipFile(file) as archive:
        for part, member in WIKI_PARTS.items():
            try:
                raw = archive.read(f"{folder}/{member}")
            except KeyError:
                raise DatasetError(f"{file}: has no {folder}/{member} (not {name}'s zip)") from None
            out[part] = articles(raw.decode("utf-8"))
    return out
