"""The byte-level BPE tokenizer of the text workloads: Hugging Face `tokenizers`, trained on a
training split with a fixed vocabulary size; deterministic (the same JSON for the same documents,
vocabulary and `tokenizers` version), so its sha256 can be recorded."""

from __future__ import annotations

import hashlib

import numpy as np

from d500.errors import UsageError

END = "<|endoftext|>"  # the one special token: id 0, appended after every document
MIN_FREQUENCY = 2  # a pair seen once is never merged


def _library():
    try:
        import tokenizers
    except ImportError:
        raise UsageError("the text workloads need Hugging Face tokenizers: pip install "
                         "'d500[text]'") from None
    return tokenizers


def version() -> str:
    return _library().__version__


def train(documents: list[str], vocab: int):
    """A byte-level BPE of `vocab` tokens (the 256 bytes, END and the merges) trained on
    `documents`, in their order."""
    tk = _library()
    if vocab < 257 + 1:
        raise UsageError(f"vocabulary size {vocab}: a byte-level BPE needs more than 257 tokens")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=MIN_FREQUENCY, special_tokens=[END],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(documents, trainer)
    return tok


def load(text: str):
    """A tokenizer from its JSON."""
    return _library().Tokenizer.from_str(text)


def sha256(tok) -> str:
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def encode(tok, documents: list[str]) -> np.ndarray:
    """The documents' token ids (int32), each document followed by END."""
    end = tok.token_to_id(END)
    pieces = []
    for e in tok.encode_batch(documents):
        pieces.append(np.asarray(e.ids, np.int32))
        pieces.append(np.asarray([end], np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
