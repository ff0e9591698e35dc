"""Building a submission package: every ledger run of an entry exported as the ledger sealed it,
with its logs, studies, provenance, chain skeleton and files, into one deterministic signed file.

    from d500.competition.export import build
    build(submission_dir, out, ledger=None, sign_key=None, warn=print) -> Path

Which runs: every run of the ledger whose `submission` is the entry's name (submission.yaml
`name`), at any level, on any backend, in any final status (failed, diverged, missed, timeout and
interrupted trials included), plus every run sharing a run group with one of its level-3 runs (the
rank rows). Runs imported into this ledger from another package are not the entry's own
measurements and are left out. Before reading, the runs of this host whose writer died are sealed
as `interrupted` (Ledger.reap, as every new run does). A run still `running` after that (its
writer alive, or on another host) cannot be exported as sealed: the build is refused naming it
(wait for it to finish, or on its host let `d500 ledger list` reap it), never left out silently.

The workload file of a run is the text it recorded (`workload_text`), packed as
files/workloads/<level folder>/<workload>.yaml; when runs of one workload recorded different texts
(the rulebook changed between them), the newest run's text gets that name and each older one
<workload>.<sha12>.yaml, so nothing is hidden and `d500 check` flags the ones not in the rulebook.
Each run record names its file (`workload_file`). Submission files recorded by a run that differ
from the ones packed are reported through `warn` (the entry changed after those runs).

Deterministic: members sorted by name, mode 0644, uid/gid 0, the tar and gzip times set to the
manifest's `created`, which is when the newest packed run stopped (not when the file was written),
and ed25519 signatures are deterministic too; so the same ledger and submission folder give the
same bytes, and an organiser importing it twice sees the same sha256. The whole chain skeleton is
packed, so any new run in the ledger (of any entry) changes the package.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import sqlite3
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from d500.competition.layout import (
    CHAIN,
    FORMAT,
    MANIFEST,
    SIGNATURE,
    STUDIES,
    SUBMISSION_FILES,
    WORKLOAD_FILES,
    environment_member,
    mllog_member,
    run_member,
    sha256,
)
from d500.errors import ConfigError, D500Error, UsageError
from d500.paths import looked_in, output_file, unwritable

STUDY_COLUMNS = ("id", "name", "level", "workload", "submission", "backend", "objective",
                 "search_space", "budget", "status", "started", "stopped", "details")
JSON_COLUMNS = ("search_space", "budget", "details")


def build(submission_dir: str | Path, out: str | Path, ledger: Any = None,
          sign_key: str | Path | None = None,
          warn: Callable[[str], None] | None = None) -> Path:
    """Write the package of the entry in `submission_dir` from `ledger` (a Ledger, a ledger file,
    or None for $D500_HOME's) to `out`, signed with the ed25519 key file `sign_key` if given.
    The package is read back and its integrity checked before it replaces `out`."""
    from d500.competition.package import Package
    from d500.ledger import Ledger

    output_file(out, "entry.tar.gz", "the package's file name")
    folder = Path(submission_dir)
    if folder.name == "submission.yaml" and folder.is_file():  # the entry's file, as train takes
        folder = folder.parent
    name = entry_name(folder)
    own = not isinstance(ledger, Ledger)
    book = Ledger.open_for_reading(ledger) if own else ledger
    try:
        book.reap()
        members, manifest, created = _collect(book, folder, name, warn or (lambda text: None))
    finally:
        if own:
            book.close()
    manifest_bytes = _json(manifest)
    members[MANIFEST] = manifest_bytes
    if sign_key is not None:
        from d500.competition import signing
        members[SIGNATURE] = _json(signing.sign(manifest_bytes, sign_key))
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(archive(members, created))
    except OSError as err:
        with contextlib.suppress(OSError):  # (its folder may be a file: nothing to remove)
            tmp.unlink(missing_ok=True)
        raise UsageError(f"{out}: cannot write the package ({unwritable(out, err)})") from None
    try:
        pkg = Package.open(tmp)
        problems = pkg.member_problems() + pkg.chain_problems()
        sig = pkg.signature()
        if sig is not None and not sig.valid:
            problems.append(f"signature: {sig.problem}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if problems:
        tmp.unlink(missing_ok=True)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise D500Error(f"{book.path}: the records of entry '{name}' do not verify: "
                        f"{problems[0]}{more}; see `d500 ledger verify`")
    tmp.replace(out)
    return out


def entry_name(folder: Path) -> str:
    """The entry's name: the `name` field of SUBMISSION_DIR/submission.yaml."""
    from d500.workload import read_yaml

    if not folder.is_dir():
        from d500.training.submission import by_name
        raise UsageError(f"{folder}: " + ("not a submission folder (one holding submission.yaml)"
                                          if folder.exists() else
                                          f"no such submission folder"
                                          f"{by_name(folder) or looked_in(folder)}"))
    path, data = read_yaml(folder / "submission.yaml")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise ConfigError(f"{path}: field 'name' must be the entry's name")
    return data["name"]


def archive(members: dict[str, bytes], created: float) -> bytes:
    """The gzip'd tar of `members`, byte for byte the same for the same members and time."""
    stamp = int(created)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=stamp) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), stamp, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(members[name]))
    return buf.getvalue()


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def _collect(book: Any, folder: Path, name: str, warn: Callable[[str], None]
             ) -> tuple[dict[str, bytes], dict[str, Any], float]:
    """The members (all but manifest and signature), the manifest and its creation time (unix
    seconds), read from one snapshot of the ledger."""
    db = sqlite3.connect(book.path, timeout=60, isolation_level=None)
    db.row_factory = sqlite3.Row
    try:
        db.execute("BEGIN")
        return _snapshot(db, book, folder, name, warn)
    finally:
        db.close()


def _snapshot(db: sqlite3.Connection, book: Any, folder: Path, name: str,
              warn: Callable[[str], None]
              ) -> tuple[dict[str, bytes], dict[str, Any], float]:
    from d500 import __version__
    from d500.ledger import iso

    ids = _run_ids(db, name)
    if not ids:
        raise UsageError(f"{book.path}: no runs of entry '{name}' (submission.yaml name) to "
                         "package")
    rows = {r["id"]: r for r in db.execute(
        f"SELECT r.*, e.digest, e.provenance, t.attempt FROM runs r LEFT JOIN environments e "
        f"ON e.id = r.env_id LEFT JOIN trials t ON t.run_id = r.id WHERE r.id IN "
        f"({','.join('?' * len(ids))}) ORDER BY r.id", ids)}
    _refuse_unsealed(rows, name)
    members: dict[str, bytes] = {}
    texts = _workload_names(rows)
    for rid, r in rows.items():
        record = _record(db, r)
        record["workload_file"] = texts.get(r["workload_sha256"])
        if r["mllog"] is not None:
            log = book.resolve_path(r["mllog"])
            try:
                members[mllog_member(rid)] = log.read_bytes()
            except OSError:
                raise D500Error(f"run {rid}: its MLLOG file {log} cannot be read; the package "
                                "would lack its log") from None
        if r["digest"] is not None:
            members[environment_member(r["digest"])] = r["provenance"].encode()
        members[run_member(rid)] = _json(record)
    for r in rows.values():
        if r["workload_text"] is not None:
            members[texts[r["workload_sha256"]]] = r["workload_text"].encode()
    files = submission_files(folder)
    members.update({SUBMISSION_FILES + rel: data for rel, data in files.items()})
    for line in _changed_files(rows, files):
        warn(line)
    members[STUDIES] = _json(_studies(db, [r["id"] for r in rows.values()]))
    chain = [list(c) for c in db.execute("SELECT chain_seq, id, prev_hash, row_hash FROM runs "
                                         "WHERE chain_seq IS NOT NULL ORDER BY chain_seq")]
    members[CHAIN] = _json(chain)
    head = db.execute("SELECT value FROM meta WHERE key = 'chain_head'").fetchone()
    version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    created = max(r["stopped"] or r["started"] for r in rows.values())
    manifest = {
        "format": FORMAT, "d500": __version__, "created": iso(created),
        "entry": name,
        "levels": sorted({r["level"] for r in rows.values() if r["level"] is not None}),
        "workloads": sorted({r["workload"] for r in rows.values() if r["workload"]}),
        "backends": sorted({r["backend"] for r in rows.values() if r["backend"]}),
        "ledger": {"chain_head": None if head is None else
                   [int(head[0].split()[0]), head[0].split()[1]],
                   "schema": None if version is None else int(version[0])},
        "runs": sorted(rows),
        "members": {n: sha256(b) for n, b in sorted(members.items())},
    }
    return members, manifest, created


def _run_ids(db: sqlite3.Connection, name: str) -> list[int]:
    """The entry's own runs and the rows of its level-3 run groups (not imported ones)."""
    own = "package_id IS NULL" if _has_column(db, "runs", "package_id") else "1"
    ids = {r[0] for r in db.execute(f"SELECT id FROM runs WHERE submission = ? AND {own}",
                                    (name,))}
    ids |= {r[0] for r in db.execute(
        f"SELECT id FROM runs WHERE {own} AND run_group IN (SELECT run_group FROM runs WHERE "
        f"submission = ? AND level = 3 AND run_group IS NOT NULL AND {own})", (name,))}
    return sorted(ids)


def _has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    return any(r[1] == column for r in db.execute(f"PRAGMA table_info({table})"))


def _refuse_unsealed(rows: dict[int, sqlite3.Row], name: str) -> None:
    open_ = [r for r in rows.values() if r["chain_seq"] is None]
    if not open_:
        return
    what = ", ".join(f"{r['id']} ({r['workload']} seed {r['seed']}, {r['status']}, pid "
                     f"{r['pid']} on {r['host']})" for r in open_[:5])
    more = f" and {len(open_) - 5} more" if len(open_) > 5 else ""
    raise D500Error(f"entry '{name}': run(s) {what}{more} are not finished and sealed; "
                    "package after they end (a dead writer's run is sealed as interrupted by "
                    "`d500 ledger list` on its host)")


def _record(db: sqlite3.Connection, r: sqlite3.Row) -> dict[str, Any]:
    """An exported run: what the ledger hashed, so its seal can be recomputed anywhere."""
    from d500.ledger import integrity

    row, evaluations, artifacts, trial = integrity.sealed_record(db, r["id"])
    return {"origin_id": r["id"], "chain_seq": r["chain_seq"], "prev_hash": r["prev_hash"],
            "row_hash": r["row_hash"], "sealed": r["sealed"], "row": row,
            "evaluations": evaluations, "artifacts": artifacts, "trial": trial,
            "attempt": r["attempt"], "environment": r["digest"],
            "mllog": None if r["mllog"] is None else mllog_member(r["id"])}


def _workload_names(rows: dict[int, sqlite3.Row]) -> dict[str, str]:
    """{workload sha256: member name}: <folder>/<workload>.yaml for the newest run's text of
    each workload, <folder>/<workload>.<sha12>.yaml for older texts."""
    from d500 import levels

    newest: dict[tuple[Any, str], sqlite3.Row] = {}
    for r in sorted(rows.values(), key=lambda r: r["id"]):
        if r["workload_text"] is not None:
            newest[r["level"], r["workload"]] = r
    names: dict[str, str] = {}
    for r in rows.values():
        digest = r["workload_sha256"]
        if r["workload_text"] is None or digest in names:
            continue
        try:
            folder = levels.get(r["level"]).folder
        except ConfigError:
            folder = str(r["level"])
        latest = newest[r["level"], r["workload"]]["workload_sha256"] == digest
        stem = r["workload"] if latest else f"{r['workload']}.{digest[:12]}"
        names[digest] = f"{WORKLOAD_FILES}{folder}/{stem}.yaml"
    return names


def submission_files(folder: Path) -> dict[str, bytes]:
    """{path relative to the folder: bytes} of every regular file in it (no dotfiles, no
    __pycache__ or .pyc), sorted."""
    out: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if (any(p.startswith(".") or p == "__pycache__" for p in rel.parts)
                or path.suffix == ".pyc" or not path.is_file()):
            continue
        try:
            out[rel.as_posix()] = path.read_bytes()
        except OSError as err:
            raise UsageError(f"{path}: cannot read it ({err.strerror})") from None
    if "submission.yaml" not in out:
        raise ConfigError(f"{folder}: no submission.yaml")
    return out


def _changed_files(rows: dict[int, sqlite3.Row], files: dict[str, bytes]) -> list[str]:
    """One line per submission file that some runs recorded with other content than packed.
    A run's files are matched by their path relative to the folder of the submission.yaml it
    recorded, so an entry folder moved or copied since still matches."""
    packed = {rel: sha256(data) for rel, data in files.items()}
    changed: dict[str, list[int]] = {}
    for rid, r in rows.items():
        recorded = json.loads(r["submission_files"] or "{}")
        roots = [PurePosixPath(p).parent for p in recorded
                 if PurePosixPath(p).name == "submission.yaml"]
        if len(roots) != 1:
            continue  # not a folder entry d500 recorded (no single submission.yaml)
        for stored, digest in recorded.items():
            path = PurePosixPath(stored)
            if not path.is_relative_to(roots[0]):
                continue
            rel = path.relative_to(roots[0]).as_posix()
            if packed.get(rel) != digest:
                changed.setdefault(rel, []).append(rid)
    return [f"{rel}: run(s) {', '.join(map(str, ids))} ran with "
            + ("a file no longer in the submission" if rel not in packed
               else "other content than the file packed (changed since)")
            for rel, ids in sorted(changed.items())]


def _studies(db: sqlite3.Connection, run_ids: list[int]) -> list[dict[str, Any]]:
    """The studies whose trials are packed: their columns (JSON ones parsed, times in unix
    seconds), origin ids."""
    marks = ",".join("?" * len(run_ids))
    out = []
    for s in db.execute(f"SELECT * FROM studies WHERE id IN (SELECT study_id FROM trials WHERE "
                        f"run_id IN ({marks})) ORDER BY id", run_ids):
        study = {c: s[c] for c in STUDY_COLUMNS}
        for c in JSON_COLUMNS:
            study[c] = None if study[c] is None else json.loads(study[c])
        out.append(study)
    return out
