"""Which static programs Inductor's cache under $D500_HOME has compiled before: one marker file per
program key, so that every compile says whether it found the cache warm (a cold compile builds
every kernel; a warm one reuses what an earlier process built, which is faster).

    key = program_key(gm, settings)    # sha256 of torch's version, the settings and the program
    warm = seen(key)                   # before compiling
    mark(key)                          # after
    before = snapshot(entries=True)    # a worker's, as its supervisor reads it at the clock
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from d500.backends.torch.compiled import inductor_cache
from d500.paths import cache, entry_cache


def _folder() -> Path:
    return Path(inductor_cache()) / "d500-programs"


def program_key(gm: torch.fx.GraphModule, settings: dict[str, Any]) -> str:
    """What a compiled program is: torch's version, the compile settings, the program's code and
    its inputs' dtypes and shapes."""
    places = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    shapes = [(str(v.dtype), tuple(v.shape)) if isinstance(v, torch.Tensor) else repr(v)
              for v in places]
    text = json.dumps([torch.__version__, settings, gm.code, shapes], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def seen(key: str) -> bool:
    """Whether this cache compiled the program `key` before."""
    return (_folder() / key).is_file()


def mark(key: str) -> None:
    """Record that this cache now holds the program `key`."""
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / key).touch()


def snapshot(entries: bool = False) -> set[str]:
    """The program keys this cache holds now; `entries`: the one an entry's worker compiles
    into (d500.paths.entry_cache, unless the user named Inductor's folder), as its judge finds
    it."""
    folder = _folder()
    if entries and folder.parent == cache("torch-inductor"):
        folder = Path(entry_cache(str(cache().parent))) / "torch-inductor" / folder.name
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()
