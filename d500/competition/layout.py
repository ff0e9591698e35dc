"""The layout of a submission package (format 1): its member names, which names are safe to
extract, its archive read within limits (read_members), and one exported run
(`runs/<origin_id>.json`) as a reader sees it.

    d500-package/manifest.json             the manifest (not listed in its own members)
    d500-package/signature.json            optional ed25519 signature over manifest.json
    d500-package/chain.json                the origin ledger's chain skeleton
    d500-package/studies.json              the studies whose trials are packed
    d500-package/environments/<digest>.json    provenance text (digest = its sha256)
    d500-package/runs/<origin_id>.json     one exported run; runs/<origin_id>.mllog.txt its MLLOG
    d500-package/files/submission/<path>   the submission folder's files
    d500-package/files/workloads/<level folder>/<workload>.yaml   the workload files run under
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from d500.errors import D500Error
from d500.untrusted import json_value

FORMAT = 1
TOP = "d500-package"
MANIFEST = f"{TOP}/manifest.json"
SIGNATURE = f"{TOP}/signature.json"
CHAIN = f"{TOP}/chain.json"
STUDIES = f"{TOP}/studies.json"
RUNS = f"{TOP}/runs/"
ENVIRONMENTS = f"{TOP}/environments/"
SUBMISSION_FILES = f"{TOP}/files/submission/"
WORKLOAD_FILES = f"{TOP}/files/workloads/"
UNLISTED = (MANIFEST, SIGNATURE)  # the members the manifest does not hash
MAX_BYTES = 1 << 28  # uncompressed bytes a package may hold (a gzip bomb stops here)
MAX_HEADER = 1 << 20  # bytes of one pax or GNU long-name header (tarfile reads it whole)
# What one run's MLLOG may hold: ~5 lines of ~230 bytes per epoch and evaluation; the largest
# honest log measured was 692 lines, 142 KB (130 epochs of a level-3 run), a 200-epoch rulebook
# run writes ~1,050 lines, 230 KB. Past these, check and import refuse it before parsing it (a
# 250 MiB compressible log took check 291 s and 2.97 GB; 1 MiB takes about a second).
MAX_LOG_BYTES = 1 << 20
MAX_LOG_LINES = 8192
MAX_LOGS_BYTES = 32 << 20  # every MLLOG of a package together (~650 honest 50 KB logs)
RUN_KEYS = ("origin_id", "chain_seq", "prev_hash", "row_hash", "sealed", "row", "evaluations",
            "artifacts", "trial", "attempt", "environment", "mllog")


def run_member(origin_id: int) -> str:
    return f"{RUNS}{origin_id}.json"


def mllog_member(origin_id: int) -> str:
    return f"{RUNS}{origin_id}.mllog.txt"


def environment_member(digest: str) -> str:
    return f"{ENVIRONMENTS}{digest}.json"


def unsafe(name: str) -> str | None:
    """Why a member name may not be extracted (None when it is safe)."""
    if "\\" in name or "\0" in name:
        return "a backslash or NUL in its name"
    path = PurePosixPath(name)
    if name.startswith("/") or path.is_absolute():
        return "an absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' part in its path"
    if parts[0] != TOP:
        return f"not under {TOP}/"
    return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Signature:
    """The package's signature: who signed (hex ed25519 public key) and whether it holds."""

    public_key: str
    valid: bool
    problem: str = ""  # why it is not valid


@dataclass
class ExportedRun:
    """One run as the origin ledger sealed it (`runs/<origin_id>.json`), with its environment's
    provenance and MLLOG text (None when their members are missing: chain_problems says so)."""

    origin_id: int
    chain_seq: int
    prev_hash: str
    row_hash: str
    sealed: str
    row: dict[str, Any]  # SEALED and SEALED_IF_SET columns as the ledger stored them
    evaluations: list[list[Any]]  # [step, epoch, wall_time, metrics text, recorded]
    artifacts: list[list[Any]]  # [path, sha256, bytes]
    trial: list[Any] | None  # [study_id, number, params text]
    attempt: int | None
    environment_digest: str | None
    environment: dict[str, Any] | None
    mllog_member: str | None
    mllog_text: str | None
    workload_member: str | None  # files/workloads/<folder>/<file> it ran under
    record: dict[str, Any] = field(repr=False, default_factory=dict)  # the JSON as packed

    def _json(self, column: str) -> Any:
        text = self.row.get(column)
        try:
            return {} if text is None else json_value(text)
        except (TypeError, ValueError):
            return {}

    @property
    def figures(self) -> dict[str, Any]:
        return self._json("figures")

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return self._json("hyperparameters")

    @property
    def details(self) -> dict[str, Any]:
        return self._json("details")

    @property
    def submission_file_hashes(self) -> dict[str, str]:
        """{path as the origin ledger stored it: sha256} of the submission files it ran with."""
        return self._json("submission_files")

    @property
    def status(self) -> str:
        return self.row.get("status")  # type: ignore[return-value]

    @property
    def level(self) -> int | None:
        return self.row.get("level")

    @property
    def workload(self) -> str | None:
        return self.row.get("workload")

    @property
    def submission(self) -> str | None:
        return self.row.get("submission")

    @property
    def backend(self) -> str | None:
        return self.row.get("backend")

    @property
    def seed(self) -> int | None:
        return self.row.get("seed")

    @property
    def error(self) -> str | None:
        return self.row.get("error")

    @property
    def started(self) -> float | None:
        return self.row.get("started")

    @property
    def stopped(self) -> float | None:
        return self.row.get("stopped")

    @property
    def group(self) -> str | None:
        return self.row.get("run_group")

    @property
    def rank(self) -> int | None:
        return self.row.get("rank")

    @property
    def world_size(self) -> int | None:
        return self.row.get("world_size")

    @property
    def study(self) -> int | None:
        """The origin id of the study this run is a trial of (None: not a trial)."""
        return None if self.trial is None else self.trial[0]

    @property
    def number(self) -> int | None:
        """Its trial number in the study (None: not a trial)."""
        return None if self.trial is None else self.trial[1]

    @property
    def params(self) -> dict[str, Any] | None:
        if self.trial is None:
            return None
        try:
            return json_value(self.trial[2]) if self.trial[2] is not None else {}
        except (TypeError, ValueError):
            return {}


INT_COLUMNS = ("level", "seed", "rank", "world_size", "env_id", "pid", "parent_run", "package_id")
NUMBER_COLUMNS = ("started", "stopped")
JSON_COLUMNS = ("figures", "hyperparameters", "details", "submission_files")
LABEL_COLUMNS = ("submission", "workload", "backend")  # names a board and d500's lines show


def printable(name: str) -> bool:
    """Whether a name a board shows holds no control or invisible formatting character: an
    entry named with a terminal's escapes ("\\x1b[2A\\x1b[2K": up two lines, erase) reached the
    leaderboard as sent, and could erase or overwrite the rows above its own; a right-to-left
    override shows a name reversed."""
    return name.isprintable()


def is_int(x: Any) -> bool:
    """Whether a JSON value is an integer (not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _json_object(x: Any) -> bool:
    try:
        return isinstance(json_value(x), dict)
    except (TypeError, ValueError):
        return False


def malformed(rec: dict[str, Any]) -> list[str]:
    """The fields of an exported run record (`runs/<id>.json`) whose values are not of the kind
    the ledger stores: row columns, evaluations, artifacts, trial, the environment's digest and
    the MLLOG's member name ([] when all are)."""
    bad = []
    row = rec.get("row")
    if not isinstance(row, dict):
        return ["row"]
    for key, value in row.items():
        if value is None:
            continue
        ok = (is_int(value) if key in INT_COLUMNS else _num(value) if key in NUMBER_COLUMNS
              else isinstance(value, str) and (key not in JSON_COLUMNS or _json_object(value))
              and (key not in LABEL_COLUMNS or printable(value)))
        if not ok:
            bad.append(f"row.{key}")
    evaluations, artifacts = rec.get("evaluations"), rec.get("artifacts")
    if not isinstance(evaluations, list) or not all(
            isinstance(e, list) and len(e) == 5 and (e[0] is None or is_int(e[0]))
            and (e[1] is None or _num(e[1])) and (e[2] is None or _num(e[2]))
            and isinstance(e[3], str) and _num(e[4]) for e in evaluations):
        bad.append("evaluations")
    if not isinstance(artifacts, list) or not all(
            isinstance(a, list) and len(a) == 3 and isinstance(a[0], str)
            and isinstance(a[1], str) and (a[2] is None or is_int(a[2])) for a in artifacts):
        bad.append("artifacts")
    environment = rec.get("environment")
    if environment is not None and not (isinstance(environment, str)
                                        and re.fullmatch(r"[0-9a-f]{64}", environment)):
        bad.append("environment")
    if rec.get("mllog") is not None and not isinstance(rec.get("mllog"), str):
        bad.append("mllog")
    trial = rec.get("trial")
    if trial is not None and not (isinstance(trial, list) and len(trial) == 3 and is_int(trial[0])
                                  and is_int(trial[1])
                                  and (trial[2] is None or isinstance(trial[2], str))):
        bad.append("trial")
    return bad


def read_members(path: Path, raw: bytes) -> dict[str, bytes]:
    """Every member of a gzip'd tar package, names and sizes checked (package.py's docstring
    says what is refused); a one-line D500Error otherwise."""
    out: dict[str, bytes] = {}
    total = 0
    try:
        data = _gunzip(path, raw)
        _headers(path, data)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                why = unsafe(info.name)
                if why is not None:
                    raise D500Error(f"{path}: member {info.name!r} refused: {why}")
                if info.isdir():
                    continue
                if not info.isreg():
                    raise D500Error(f"{path}: member {info.name} refused: a link or special "
                                    "file, not a regular file")
                if info.name in out:
                    raise D500Error(f"{path}: member {info.name} appears twice")
                total += info.size
                if total > MAX_BYTES:
                    raise D500Error(f"{path}: more than {MAX_BYTES >> 20} MiB of content")
                f = tar.extractfile(info)
                out[info.name] = f.read() if f is not None else b""
        for name in out:
            parts = name.split("/")
            clash = next((p for p in ("/".join(parts[:i]) for i in range(2, len(parts)))
                          if p in out), None)
            if clash is not None:
                raise D500Error(f"{path}: member {name} refused: {clash} is a file, not a "
                                "folder")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise D500Error(f"{path}: not a d500 package (not a readable gzip'd tar: "
                        f"{' '.join(str(err).split()) or type(err).__name__})") from None
    return out


def _gunzip(path: Path, raw: bytes) -> bytes:
    """The gzip'd bytes decompressed in steps, refused once they pass MAX_BYTES."""
    out = bytearray()
    rest = raw
    while rest:
        unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while rest and not unzip.eof:
            out += unzip.decompress(rest, 1 << 20)
            rest = unzip.unconsumed_tail
            if len(out) > MAX_BYTES:
                raise D500Error(f"{path}: not a d500 package (more than {MAX_BYTES >> 20} MiB "
                                "once decompressed)")
        if not unzip.eof:
            raise D500Error(f"{path}: not a d500 package (its gzip stream is truncated)")
        rest = unzip.unused_data  # a following gzip member, as gzip itself reads them
    return bytes(out)


def _headers(path: Path, data: bytes) -> None:
    """Refuse pax and GNU long-name headers over MAX_HEADER before tarfile reads them whole."""
    pos = 0
    while pos + 512 <= len(data):
        block = data[pos:pos + 512]
        if block.count(0) == 512:
            return
        size = tarfile.nti(block[124:136])
        if block[156:157] in (b"x", b"g", b"L", b"K") and size > MAX_HEADER:
            raise D500Error(f"{path}: not a d500 package (a {size >> 20} MiB tar header; "
                            f"headers may hold {MAX_HEADER >> 10} KiB)")
        pos += 512 + (size + 511) // 512 * 512
