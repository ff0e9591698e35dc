"""Helpers for the competition tests: read a package's members and write a changed copy of it
(a tampered member, with or without the manifest re-hashed; a run's record or MLLOG changed and
every seal, row hash and chain link re-made), as an attacker would; draw seeds for reproduce."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

from d500.competition import reproduce as rp
from d500.competition.export import archive
from d500.competition.layout import CHAIN, MANIFEST, SIGNATURE, mllog_member
from d500.competition.package import Package
from d500.ledger import integrity
from d500.ledger.store import dumps

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


def reseal(origin_id: int, change: Callable[[dict], None] | None = None,
           record: Callable[[dict], None] | None = None, legacy: bool = False) -> Edit:
    """An edit changing one run's figures (`change`, on its figures dict) and/or its packed
    record (`record`, on the whole record: row, evaluations, artifacts, ...) and re-making, as a
    forger would, its seal, its row hash, every later link of the chain and the manifest's chain
    head. With `legacy` the seal is of the old kind (over env_id, not the provenance digest), as
    a d500 before the digest was sealed made it."""
    def edit(found: dict[str, bytes]) -> None:
        records = {}
        for name, data in found.items():
            if re.fullmatch(r"d500-package/runs/\d+\.json", name):
                rec = json.loads(data)
                records[rec["chain_seq"]] = (name, rec)
        _, rec = next(v for v in records.values() if v[1]["origin_id"] == origin_id)
        if change is not None:
            figures = json.loads(rec["row"]["figures"])
            change(figures)
            rec["row"]["figures"] = dumps(figures)
        if record is not None:
            record(rec)
        rec["sealed"] = json.dumps(integrity.seal_fields(rec["row"], rec["evaluations"],
                                                         rec["artifacts"], rec["trial"],
                                                         integrity.LEGACY if legacy
                                                         else rec["environment"]),
                                   sort_keys=True)
        chain = json.loads(found[CHAIN])
        prev = rec["prev_hash"]
        for link in chain[rec["chain_seq"] - 1:]:
            name, later = records[link[0]]  # every later row is this entry's: all packed
            later["prev_hash"] = prev
            later["row_hash"] = integrity.row_hash(prev, later["origin_id"], later["sealed"])
            link[2], link[3] = prev, later["row_hash"]
            prev = later["row_hash"]
            found[name] = (json.dumps(later, indent=1, sort_keys=True) + "\n").encode()
        found[CHAIN] = json.dumps(chain).encode()
        manifest = json.loads(found[MANIFEST])
        manifest["ledger"]["chain_head"] = [chain[-1][0], prev]
        found[MANIFEST] = json.dumps(manifest).encode()
    return edit


def forge_log(origin_id: int, change: Callable[[str], str]) -> Edit:
    """An edit rewriting one run's packed MLLOG (`change` on its text) and re-sealing the run
    with the new log's sha256 and size, so that the package's integrity passes."""
    def edit(found: dict[str, bytes]) -> None:
        log = mllog_member(origin_id)
        found[log] = change(found[log].decode()).encode()

        def artifact(rec: dict) -> None:
            for art in rec["artifacts"]:
                if art[0] == rec["row"]["mllog"]:
                    art[1:] = [hashlib.sha256(found[log]).hexdigest(), len(found[log])]
        reseal(origin_id, record=artifact)(found)
    return edit


def draw_seed(path: Path, k: int, wanted: set[int], avoid: set[int] = frozenset()) -> int:
    """The first reproduce draw seed whose choice of k runs of the package at `path` holds
    every `wanted` run and no `avoid` one."""
    candidates, _ = rp.drawable(Package.open(path).runs())
    for seed in range(10_000):
        ids = {r.origin_id for r in rp.choose(candidates, k, seed)}
        if wanted <= ids and not ids & avoid:
            return seed
    raise AssertionError(f"no seed draws {wanted}")
