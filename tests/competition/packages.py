"""Helpers for the competition tests: read a package's members and write a changed copy of it
(a tampered member, with or without the manifest re-hashed), as an attacker would."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

from d500.competition.export import archive
from d500.competition.layout import MANIFEST, SIGNATURE

Edit = Callable[[dict[str, bytes]], None]


def members(path: Path) -> dict[str, bytes]:
    """{name: bytes} of every regular member, read with tarfile directly (not the reader)."""
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore


def repack(src: Path, dst: Path, edit: Edit, rehash: bool = True) -> Path:
    """Copy the package `src` to `dst` with `edit` applied to its {name: bytes}; with rehash the
    manifest's member hashes are recomputed (the signature, if any, is kept as it was)."""
    found = members(src)
    edit(found)
    if rehash:
        manifest = json.loads(found[MANIFEST])
        manifest["members"] = {n: hashlib.sha256(b).hexdigest() for n, b in sorted(found.items())
                               if n not in (MANIFEST, SIGNATURE)}
        found[MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    dst.write_bytes(archive(found, 0))
    return dst


def edit_json(name: str, change: Callable[[dict], None]) -> Edit:
    """An edit that parses member `name` as JSON, applies `change` and writes it back."""
    def edit(found: dict[str, bytes]) -> None:
        data = json.loads(found[name])
        change(data)
        found[name] = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    return edit


def raw_tar(dst: Path, entries: list[tuple[str, bytes | None, bytes]]) -> Path:
    """A gzip'd tar of (name, link target or None, content) entries, links as symlinks: for
    members no d500 package would hold."""
    with tarfile.open(dst, "w:gz") as tar:
        for name, link, data in entries:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return dst
