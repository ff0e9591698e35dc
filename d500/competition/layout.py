"""The layout of a submission package (format 1): its member names, which names are safe to
extract, and one exported run (`runs/<origin_id>.json`) as a reader sees it.

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
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

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
MAX_BYTES = 1 << 30  # uncompressed content a package may hold (a gzip bomb stops here)
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
            return {} if text is None else json.loads(text)
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
            return json.loads(self.trial[2]) if self.trial[2] is not None else {}
        except (TypeError, ValueError):
            return {}

    @property
    def points(self) -> list[dict[str, Any]]:
        """The evaluations as dicts: step, epoch, wall_time, metrics (parsed), recorded."""
        out = []
        for step, epoch, wall, metrics, recorded in self.evaluations:
            try:
                parsed = json.loads(metrics)
            except (TypeError, ValueError):
                parsed = {}
            out.append({"step": step, "epoch": epoch, "wall_time": wall, "metrics": parsed,
                        "recorded": recorded})
        return out
