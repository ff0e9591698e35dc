"""Language-model splits of a text corpus: documents split by a seeded permutation (never by
line), a byte-level BPE trained on the training documents alone, each split tokenized, and cut
into windows of `context` tokens whose labels are the next tokens.

The tokenizer and the token ids are prepared once per (corpus, split, vocabulary, `tokenizers`
version) under $D500_HOME/cache/text/, before a run opens (`prepare`), so that no run's clock
includes training a tokenizer. A workload may record the sha256 of the prepared tokens
(`dataset.tokens_sha256`): a cache that does not match is rebuilt, and a rebuild that does not
match either is refused by name (another `tokenizers` version, or an edited corpus).

    spec = TextSpec("python-stdlib", train=152, validation=8, test=8, seed=0, context=64,
                    vocab=1024)
    parts = splits(spec)    # d500.training.data.splits.Splits; x, y: int64 [windows, context]
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from d500.errors import DatasetError
from d500.training.data import shuffle
from d500.training.data.splits import Part, Splits, SplitSpec

PARTS = ("train", "validation", "test")
# the token counts (train, validation) of the tokens a rulebook workload pins by tokens_sha256,
# so that d500 check knows its windows (count_windows) without the corpus or a tokenizer
TOKENS = {"f37c37cbdc476915edc0c0465461a1397f72be323413e325e3d91977f9df782b": (1624523, 41012)}


def count_windows(tokens_sha256: object, context: object) -> tuple[int, int] | None:
    """(train, validation) windows of the pinned tokens at `context`; None: not known here."""
    counts = TOKENS.get(tokens_sha256) if isinstance(tokens_sha256, str) else None
    if counts is None or type(context) is not int or context < 1:
        return None
    return (counts[0] - 1) // context, (counts[1] - 1) // context


@dataclass(frozen=True)
class TextSpec:
    """The text split a workload fixes: document counts, seed, window length, vocabulary."""

    name: str
    train: int
    validation: int
    test: int
    seed: int
    context: int
    vocab: int
    tokens_sha256: str | None = None

    def split(self) -> SplitSpec:
        return SplitSpec(self.train, self.validation, self.test, self.seed)


def _corpus(name: str):
    from d500.training.data import corpora, text
    if name != text.NAME:
        raise DatasetError(f"unknown text corpus '{name}' (known: {text.NAME}, "
                           f"{', '.join(corpora.NAMES)})")
    return text


def corpus(name: str) -> list[tuple[str, str]]:
    """The documents of a text corpus, its file checked against its recorded sha256."""
    return _corpus(name).documents()


def corpus_file(name: str, data_dir: str | Path | None = None) -> dict[str, str]:
    """{file name: "sha256:<hex>"} of a text corpus, after checking the file's digest (a corpus
    users bring is read from `data_dir`: d500.training.data.corpora)."""
    from d500.training.data import corpora
    if name in corpora.NAMES:
        return corpora.files(name, data_dir)
    text = _corpus(name)
    text.checked()
    return {text.FILE: f"sha256:{text.SHA256}"}


def document_split(count: int, spec: SplitSpec) -> tuple[list[int], list[int], list[int]]:
    """(train, validation, test) document indices, each sorted: one seeded permutation, test
    first, then validation, then train (as d500.training.data.splits does for samples)."""
    total = spec.train + spec.validation + spec.test
    if total > count:
        from d500.errors import ConfigError
        raise ConfigError(f"split: train {spec.train} + validation {spec.validation} + test "
                          f"{spec.test} = {total} documents exceeds the corpus's {count}")
    order = shuffle.permutation(count, "documents", spec.seed)
    test = order[:spec.test]
    validation = order[spec.test:spec.test + spec.validation]
    train = order[spec.test + spec.validation:total]
    return sorted(map(int, train)), sorted(map(int, validation)), sorted(map(int, test))


def _key(spec: TextSpec, digest: str, version: str) -> str:
    fields = [spec.name, digest, spec.train, spec.validation, spec.test, spec.seed, spec.vocab,
              version]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:32]


def tokens_digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over the three splits' token ids (int32, little-endian), in PARTS order."""
    h = hashlib.sha256()
    for part in PARTS:
        h.update(part.encode() + b"|" + np.ascontiguousarray(arrays[part], "<i4").tobytes())
    return h.hexdigest()


def texts(spec: TextSpec, data_dir: str | Path | None = None) -> dict[str, list[str]]:
    """The documents of each part: WikiText's first N articles of each of its own split files,
    else the workload's seeded permutation of the corpus's documents (document_split)."""
    from d500.training.data import corpora
    if spec.name not in corpora.NAMES:
        docs = corpus(spec.name)
    else:
        found = corpora.documents(spec.name, data_dir)
        docs = found.get("all", [])
        if "all" not in found:
            from d500.errors import ConfigError
            out = {}
            for part in PARTS:
                want, have = getattr(spec, part), len(found[part])
                if want > have:
                    raise ConfigError(f"split: {part} {want} documents exceeds the {have} "
                                      f"articles of {spec.name}'s {part} file")
                out[part] = [text for _, text in found[part][:want]]
            return out
    picked = document_split(len(docs), spec.split())
    return {part: [docs[i][1] for i in idx] for part, idx in zip(PARTS, picked)}


def _build(spec: TextSpec, data_dir: str | Path | None = None
           ) -> tuple[dict[str, np.ndarray], str]:
    from d500.training.data import tokenizer
    texts_ = texts(spec, data_dir)
    tok = tokenizer.train(texts_["train"], spec.vocab)
    return {part: tokenizer.encode(tok, texts_[part]) for part in PARTS}, tok.to_str()


def prepare(spec: TextSpec, data_dir: str | Path | None = None) -> Path:
    """The cached tokens of `spec` (built when missing, or not matching the workload's
    tokens_sha256), as the path of an .npz with arrays train, validation, test; the tokenizer's
    JSON is beside it."""
    from d500 import paths
    from d500.training.data import tokenizer
    digest = next(iter(corpus_file(spec.name, data_dir).values()))
    folder = paths.cache("text")
    file = folder / f"{spec.name}-{_key(spec, digest, tokenizer.version())}.npz"
    if file.is_file() and (spec.tokens_sha256 is None
                           or tokens_digest(_read(file)) == spec.tokens_sha256):
        return file
    from d500.say import say
    say(f"{spec.name}: training a {spec.vocab}-token byte-level BPE on {spec.train} documents "
        f"and tokenizing the splits (once; cached in {folder})")
    arrays, tok = _build(spec, data_dir)
    got = tokens_digest(arrays)
    if spec.tokens_sha256 is not None and got != spec.tokens_sha256:
        raise DatasetError(
            f"{spec.name}: the tokens prepared here have sha256 {got}, not the workload's "
            f"tokens_sha256 {spec.tokens_sha256} (another tokenizers version than "
            f"{tokenizer.version()}, or another corpus)")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    # each process its own temporary files (level 3's ranks prepare the cache at once: one
    # rank's rename took the other's shared .tmp away, FileNotFoundError), the tokenizer first
    own = f".{os.getpid()}.tmp"
    temporary = file.with_suffix(own)
    temporary.write_text(tok, encoding="utf-8")
    temporary.replace(file.with_suffix(".tokenizer.json"))
    temporary.write_bytes(buffer.getvalue())
    temporary.replace(file)
    return file


def _read(file: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(file) as data:
            return {part: np.asarray(data[part], np.int32) for part in PARTS}
    except (OSError, ValueError, KeyError) as err:
        raise DatasetError(f"{file}: an unreadable token cache ({err}); delete it") from err


def windows(ids: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of `context` tokens (int64 [M, context]) and their next tokens."""
    count = (len(ids) - 1) // context
    if count < 1:
        raise DatasetError(f"a split of {len(ids)} tokens is shorter than one window of "
                           f"{context} + 1")
    x = ids[:count * context].reshape(count, context).astype(np.int64)
    y = ids[1:count * context + 1].reshape(count, context).astype(np.int64)
    return x, y


def splits(spec: TextSpec, data_dir: str | Path | None = None
           ) -> tuple[Splits, dict[str, str]]:
    """The three parts as windows, and the files they came from with their digests (the corpus
    is checked again: the cache is only as good as the file it was made from)."""
    files = corpus_file(spec.name, data_dir)
    file = prepare(spec, data_dir)
    arrays = _read(file)
    got = tokens_digest(arrays)
    if spec.tokens_sha256 is not None and got != spec.tokens_sha256:
        raise DatasetError(f"{file}: token sha256 {got} is not the workload's tokens_sha256 "
                           f"{spec.tokens_sha256} (the cache changed after it was prepared)")
    known = TOKENS.get(got)
    if known is not None and known != (len(arrays["train"]), len(arrays["validation"])):
        raise DatasetError(f"{file}: {len(arrays['train'])} training and "
                           f"{len(arrays['validation'])} validation tokens, but lm.TOKENS "
                           f"records {known} for sha256 {got}")
    parts = []
    for part in PARTS:
        x, y = windows(arrays[part], spec.context)
        parts.append(Part(x, y, np.arange(len(x), dtype=np.int64)))
    return Splits(spec.name, spec.split(), *parts, None), {**files, file.name: f"sha256:{got}"}
