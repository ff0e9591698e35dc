"""The corpora users bring: WikiText raw (its zip, in WikiText's real layout) and TinyShakespeare,
built small in a temporary folder (never downloaded). Checked: articles and speeches are the
documents and no document is cut between splits; a missing file or one whose sha256 is not the
published one is one line naming it (exit 2 from `d500 train`). The fixtures' own digests are
set the way registry.py documents for tests (its REGISTRY entry replaced), never by loosening
the check."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from d500.errors import DatasetError
from d500.training.data import corpora, lm, registry

ROOT = Path(__file__).resolve().parents[2]


def _article(title: str, n: int) -> str:
    """One article as WikiText writes it: a title, sections, paragraphs, blank lines."""
    body = [f" = {title} = \n", " \n"]
    for s in range(2):
        body += [f" = = Section {s} of {title} = = \n", " \n"]
        body += [f" = = = Part {s} = = = \n", " \n"] if s else []
        body += [f" The {title} paragraph {k} , with @-@ hyphens and 1 @,@ 000 numbers "
                 f"( {n} ) . \n" for k in range(3)] + [" \n"]
    return "".join(body)


def _wikitext(folder: Path, counts: dict[str, int]) -> Path:
    """A wikitext-2-raw-v1.zip with `counts` articles per split file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "wikitext-2-raw-v1.zip"
    with zipfile.ZipFile(path, "w") as z:
        for part, member in corpora.WIKI_PARTS.items():
            text = " \n" + "".join(_article(f"{part.title()} Article {i}", i)
                                   for i in range(counts[part]))
            z.writestr(f"wikitext-2-raw/{member}", text)
    return path


def _shakespeare(folder: Path, speeches: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    blocks = [f"Speaker {i % 7}:\nLine one of speech {i},\nand line two.\n" for i in
              range(speeches)]
    path = folder / "input.txt"
    path.write_text("\n".join(blocks), encoding="utf-8")
    return path


def _trust(monkeypatch, name: str, path: Path) -> None:
    """The organiser override registry.py documents for tests: the entry with the fixture's
    digest (the check itself is unchanged)."""
    spec = registry.REGISTRY[name]
    data = path.read_bytes()
    file = registry.File(spec.files[0].name, hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(registry.REGISTRY, name, registry.Spec(
        spec.name, spec.homepage, spec.url_base, (file,)))


def test_wikitext_articles_are_the_documents_and_its_files_the_splits(tmp_path, monkeypatch):
    _trust(monkeypatch, "wikitext-2-raw",
           _wikitext(tmp_path / "data", {"train": 5, "validation": 2, "test": 2}))
    found = corpora.documents("wikitext-2-raw", tmp_path / "data")
    assert [len(found[p]) for p in ("train", "validation", "test")] == [5, 2, 2]
    title, text = found["train"][3]
    assert title == "Train Article 3" and text.startswith(" = Train Article 3 = \n")
    assert " = = = Part 1 = = = \n" in text and "Train Article 4" not in text  # sections stay
    spec = lm.TextSpec("wikitext-2-raw", train=4, validation=2, test=1, seed=0, context=8,
                       vocab=300)
    parts = lm.texts(spec, tmp_path / "data")
    assert parts["train"] == [t for _, t in found["train"][:4]]  # the first N of its own file
    assert parts["test"] == [found["test"][0][1]]
    monkeypatch.setenv("D500_HOME", str(tmp_path / "home"))
    splits, files = lm.splits(spec, tmp_path / "data")
    assert splits.train.x.shape[1] == 8 and len(splits.test.y) > 0
    assert files["wikitext-2-raw-v1.zip"] == \
        f"sha256:{registry.REGISTRY['wikitext-2-raw'].files[0].sha256}"
    with pytest.raises(Exception, match="test 3 documents exceeds the 2 articles"):
        lm.texts(lm.TextSpec("wikitext-2-raw", 4, 2, 3, 0, 8, 300), tmp_path / "data")


def test_tinyshakespeare_speeches_are_split_whole(tmp_path, monkeypatch):
    _trust(monkeypatch, "tinyshakespeare", _shakespeare(tmp_path / "data", 40))
    docs = corpora.documents("tinyshakespeare", tmp_path / "data")["all"]
    assert len(docs) == 40 and docs[8] == ("9: Speaker 1", "Speaker 1:\nLine one of speech 8,"
                                                           "\nand line two.\n")
    parts = lm.texts(lm.TextSpec("tinyshakespeare", 30, 5, 5, 7, 8, 300), tmp_path / "data")
    whole = {t for _, t in docs}
    seen = [t for p in ("train", "validation", "test") for t in parts[p]]
    assert len(seen) == 40 and set(seen) == whole  # every speech once, none cut


def test_a_wrong_or_missing_file_is_one_line_naming_it(tmp_path):
    zipped = _wikitext(tmp_path / "data", {"train": 2, "validation": 1, "test": 1})
    with pytest.raises(DatasetError) as err:  # the fixture is not the published file
        corpora.documents("wikitext-2-raw", tmp_path / "data")
    published = registry.REGISTRY["wikitext-2-raw"].files[0].sha256
    assert str(zipped) in str(err.value) and f"is not the published {published}" in str(err.value)
    with pytest.raises(DatasetError, match=r"input.txt: missing; tinyshakespeare needs input.txt"):
        corpora.documents("tinyshakespeare", tmp_path / "data")


def test_d500_train_refuses_a_missing_corpus_with_one_line(tmp_path):
    wl = yaml.safe_load((ROOT / "levels" / "2-training" / "text-lm.yaml").read_text())
    wl.update(name="wiki-lm", dataset={"name": "wikitext-2-raw", "train": 600,
                                       "validation": 60, "test": 60, "context": 64,
                                       "vocab": 1024})
    (tmp_path / "wiki-lm.yaml").write_text(yaml.safe_dump(wl))
    entry = yaml.safe_load((ROOT / "submissions" / "adamw" / "submission.yaml").read_text())
    entry["workloads"] = ["wiki-lm"]
    (tmp_path / "entry").mkdir()
    (tmp_path / "entry" / "submission.yaml").write_text(yaml.safe_dump(entry))
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "D500_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "d500.cli", "train", "wiki-lm.yaml",
                           "--submission", "entry", "--data", "empty"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "wikitext-2-raw-v1.zip: missing" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "runs").exists()  # nothing recorded
