"""Reading a submission package (format 1): its members, manifest, signature and exported runs,
and the integrity checks anyone can run on it without the origin ledger.

    from d500.competition.package import Package
    pkg = Package.open(path)          # D500Error: not a d500 package, unreadable, bad format
    pkg.manifest, pkg.sha256, pkg.member("d500-package/chain.json") -> bytes
    pkg.member_problems()             # members whose sha256 differs from the manifest, missing
                                      # or unlisted members, listed runs without their record
    pkg.signature()                   # Signature(public_key, valid, problem) or None
    pkg.runs()                        # [ExportedRun], ascending origin id
    pkg.studies(), pkg.chain()        # studies.json; chain.json as [(seq, run, prev, hash)]
    pkg.chain_problems()              # seals, row hashes and chain links recomputed; MLLOG,
                                      # environment and workload members against the seals
    pkg.submission_problems()         # submission files the runs recorded but not packed
    match_submission_file(stored, sha, {rel: sha}) -> rel | None
    pkg.workload_files()              # {"2-training/digits-mlp.yaml": bytes}
    pkg.submission_files()            # {"submission.yaml": bytes, ...}
    pkg.extract(dest) -> dest/files   # the files/ tree (everything=True: every member)

A package is untrusted input: every member must be a regular file under `d500-package/` with a
relative name free of `..`, empty or `.` parts and backslashes; links, devices, duplicated names
a name that is also another member's folder, more than MAX_BYTES once decompressed and pax or
GNU long-name headers over MAX_HEADER are refused when it is opened, so nothing can be written
outside the folder it is extracted to and a small file cannot make the reader take much memory.
A run's MLLOG over layout.MAX_LOG_BYTES or MAX_LOG_LINES, or a package's MLLOGs over
MAX_LOGS_BYTES together, is refused by runs() before anything parses it (check's time bounded).

What the checks can and cannot tell: chain_problems recomputes the seal and row hash of every
packed run from its exported record, and finds each one at its place in chain.json, whose links
are walked from genesis to the manifest's head. Rows of the origin ledger that are not packed
appear in chain.json only as hashes. This shows that nothing changed after packing; it cannot
stop the sender: whoever holds the ledger can edit a run, recompute its seal, its row hash and
every later link, and sign the result. A signature proves who sent the package and that nothing
changed on the way; only a re-run (`d500 reproduce`) checks the figures themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from d500.competition.layout import (
    CHAIN,
    FORMAT,
    MANIFEST,
    MAX_BYTES,
    MAX_LOG_BYTES,
    MAX_LOG_LINES,
    MAX_LOGS_BYTES,
    RUN_KEYS,
    SIGNATURE,
    STUDIES,
    SUBMISSION_FILES,
    TOP,
    UNLISTED,
    WORKLOAD_FILES,
    ExportedRun,
    Signature,
    environment_member,
    malformed,
    printable,
    read_members,
    run_member,
    sha256,
)
from d500.errors import D500Error, UsageError
from d500.ledger import integrity
from d500.untrusted import json_value

__all__ = ["ExportedRun", "Package", "Signature"]


class Package:
    """A submission package read into memory, its names checked (see the module docstring)."""

    def __init__(self, path: Path, members: dict[str, bytes], digest: str):
        self.path, self._members, self.sha256 = path, members, digest
        self.manifest = self._manifest()
        self._runs: list[ExportedRun] | None = None

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path) -> Package:
        """Read a package; a missing, unreadable or malformed file is a one-line D500Error."""
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{path}: a folder, where a package file (d500 package --out) goes")
        if path.exists() and not path.is_file():  # /dev/null, a pipe: 'no such package file'
            raise UsageError(f"{path}: not a regular file, where a package file goes")
        if not path.is_file():
            from d500.paths import looked_in
            raise UsageError(f"{path}: no such package file{looked_in(path)}")
        try:
            if path.stat().st_size > MAX_BYTES:
                raise D500Error(f"{path}: not a d500 package (more than {MAX_BYTES >> 20} MiB)")
            raw = path.read_bytes()
        except OSError as err:
            raise D500Error(f"{path}: cannot read it ({err.strerror})") from None
        return cls(path, read_members(path, raw), sha256(raw))

    def _manifest(self) -> dict[str, Any]:
        where = f"{self.path}: {MANIFEST}"
        if MANIFEST not in self._members:
            raise D500Error(f"{self.path}: not a d500 package (it has no {MANIFEST})")
        try:
            manifest = json_value(self._members[MANIFEST])
        except (UnicodeDecodeError, ValueError) as err:
            raise D500Error(f"{where}: not JSON ({err})") from None
        if not isinstance(manifest, dict):
            raise D500Error(f"{where}: not a JSON object")
        if manifest.get("format") != FORMAT:
            raise D500Error(f"{where}: format {manifest.get('format')!r}; this d500 reads "
                            f"format {FORMAT}")
        members = manifest.get("members")
        if not isinstance(members, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in members.items()):
            raise D500Error(f"{where}: field 'members' must map member names to sha256 hex")
        runs = manifest.get("runs")
        if not isinstance(runs, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in runs):
            raise D500Error(f"{where}: field 'runs' must be a list of run ids")
        if not isinstance(manifest.get("entry"), str) or not printable(manifest["entry"]):
            raise D500Error(f"{where}: field 'entry' must be the entry's name (printable "
                            f"characters only: {manifest.get('entry')!r})")
        return manifest

    # ------------------------------------------------------------ members
    def names(self) -> list[str]:
        return sorted(self._members)

    def member(self, name: str) -> bytes:
        """A member's bytes, by its full name or its name inside `d500-package/`."""
        full = name if name.startswith(f"{TOP}/") else f"{TOP}/{name}"
        try:
            return self._members[full]
        except KeyError:
            raise D500Error(f"{self.path}: no member {full}") from None

    def _json_member(self, name: str) -> Any:
        try:
            return json_value(self.member(name))
        except (UnicodeDecodeError, ValueError) as err:
            raise D500Error(f"{self.path}: {name}: not JSON ({err})") from None

    def member_problems(self) -> list[str]:
        """Members whose sha256 differs from the manifest's, listed members that are missing,
        members the manifest does not list, and listed runs without their record."""
        listed: dict[str, str] = self.manifest["members"]
        present = {n for n in self._members if n not in UNLISTED}
        problems = []
        for name in sorted(set(listed) | present):
            if name not in present:
                problems.append(f"{name}: listed in the manifest but missing")
            elif name not in listed:
                problems.append(f"{name}: in the package but not listed in the manifest")
            elif sha256(self._members[name]) != listed[name]:
                problems.append(f"{name}: sha256 {sha256(self._members[name])[:12]}… differs "
                                f"from the manifest's {listed[name][:12]}…")
        for rid in self.manifest["runs"]:
            if run_member(rid) not in self._members:
                problems.append(f"run {rid}: listed in the manifest but {run_member(rid)} is "
                                "missing")
        return problems

    def signature(self) -> Signature | None:
        """The signature over manifest.json's bytes, checked; None for an unsigned package."""
        if SIGNATURE not in self._members:
            return None
        try:
            sig = json_value(self._members[SIGNATURE])
        except (UnicodeDecodeError, ValueError):
            return Signature("", False, f"{SIGNATURE} is not JSON")
        if not isinstance(sig, dict):
            return Signature("", False, f"{SIGNATURE} is not a JSON object")
        key = sig.get("public_key") if isinstance(sig.get("public_key"), str) else ""
        if sig.get("algorithm") != "ed25519":
            return Signature(key, False, f"algorithm {sig.get('algorithm')!r}, not ed25519")
        from d500.competition import signing
        problem = signing.verify(self._members[MANIFEST], key, sig.get("signature"))
        return Signature(key, problem is None, problem or "")

    # ------------------------------------------------------------ contents
    def runs(self) -> list[ExportedRun]:
        """Every run the manifest lists, ascending origin id; a malformed record is a
        D500Error naming it."""
        if self._runs is None:
            runs, total = [], 0
            for rid in sorted(self.manifest["runs"]):
                runs.append(self._run(rid))
                total += len(self._members.get(runs[-1].mllog_member or "", b""))
                if total > MAX_LOGS_BYTES:
                    raise D500Error(f"{self.path}: its MLLOGs hold more than "
                                    f"{MAX_LOGS_BYTES >> 20} MiB together (at run {rid}); "
                                    f"d500 checks no more than that of one package")
            self._runs = runs
        return list(self._runs)

    def _run(self, rid: int) -> ExportedRun:
        name = run_member(rid)
        rec = self._json_member(name)
        if not isinstance(rec, dict):
            raise D500Error(f"{self.path}: {name}: not a JSON object")
        missing = [k for k in RUN_KEYS if k not in rec]
        if missing:
            raise D500Error(f"{self.path}: {name}: lacks {', '.join(missing)}")
        if rec["origin_id"] != rid:
            raise D500Error(f"{self.path}: {name}: origin_id {rec['origin_id']!r}, not {rid}")
        shapes = [("sealed", str), ("prev_hash", str), ("row_hash", str), ("chain_seq", int)]
        bad = [k for k, kind in shapes if not isinstance(rec[k], kind)] + malformed(rec)
        if not (rec["attempt"] is None or type(rec["attempt"]) is int):
            bad.append("attempt")
        if bad:
            raise D500Error(f"{self.path}: {name}: malformed field(s) {', '.join(bad)}")
        digest = rec["environment"]
        env = None
        if isinstance(digest, str) and environment_member(digest) in self._members:
            try:
                env = json_value(self._members[environment_member(digest)])
            except (UnicodeDecodeError, ValueError):
                env = None
        log = rec["mllog"] if isinstance(rec["mllog"], str) else None
        text = None
        if log is not None and log in self._members:
            self._log_size(rid, log)
            text = self._members[log].decode("utf-8", errors="replace")
        workload = rec.get("workload_file")
        return ExportedRun(rid, rec["chain_seq"], rec["prev_hash"], rec["row_hash"],
                           rec["sealed"], rec["row"], rec["evaluations"], rec["artifacts"],
                           rec["trial"], rec["attempt"], digest if isinstance(digest, str)
                           else None, env, log, text,
                           workload if isinstance(workload, str) else None, rec)

    def _log_size(self, rid: int, log: str) -> None:
        """Refuse, before anything parses it, an MLLOG larger than a run writes (layout)."""
        data = self._members[log]
        lines = data.count(b"\n")
        if len(data) > MAX_LOG_BYTES or lines > MAX_LOG_LINES:
            raise D500Error(f"{self.path}: run {rid}: {log}: {len(data):,} bytes, {lines:,} "
                            f"lines; a run's MLLOG holds at most {MAX_LOG_BYTES >> 20} MiB and "
                            f"{MAX_LOG_LINES:,} lines (~5 per epoch), so it is not parsed")

    def studies(self) -> list[dict[str, Any]]:
        """studies.json: the studies whose trials are packed (origin ids)."""
        if f"{STUDIES}" not in self._members:
            return []
        found = self._json_member(STUDIES)
        if not isinstance(found, list) or not all(isinstance(s, dict) for s in found):
            raise D500Error(f"{self.path}: {STUDIES}: not a list of studies")
        return found

    def chain(self) -> list[tuple[int, int, str, str]]:
        """chain.json: the origin ledger's chain skeleton, [(chain_seq, run_id, prev_hash,
        row_hash)] from genesis to its head."""
        found = self._json_member(CHAIN)
        if not isinstance(found, list) or not all(
                isinstance(x, list) and len(x) == 4 and isinstance(x[0], int)
                and isinstance(x[1], int) and isinstance(x[2], str) and isinstance(x[3], str)
                for x in found):
            raise D500Error(f"{self.path}: {CHAIN}: not a list of [seq, run, prev, hash]")
        return [tuple(x) for x in found]  # type: ignore[misc]

    def workload_files(self) -> dict[str, bytes]:
        """{"<level folder>/<file>.yaml": bytes} of the workload files the runs recorded."""
        return {n[len(WORKLOAD_FILES):]: b for n, b in sorted(self._members.items())
                if n.startswith(WORKLOAD_FILES)}

    def submission_files(self) -> dict[str, bytes]:
        """{path inside the submission folder: bytes} of the entry's files."""
        return {n[len(SUBMISSION_FILES):]: b for n, b in sorted(self._members.items())
                if n.startswith(SUBMISSION_FILES)}

    # ------------------------------------------------------------ integrity
    def chain_problems(self) -> list[str]:
        """Each packed run's seal and row hash recomputed from its record and found in
        chain.json, chain.json's links walked from genesis to the manifest's head, and each
        run's MLLOG, environment and workload file compared with what its seal recorded."""
        problems: list[str] = []
        try:
            chain = self.chain()
        except D500Error as err:
            problems.append(str(err))
            chain = []
        problems += _links(chain, self.manifest.get("ledger", {}).get("chain_head")
                           if isinstance(self.manifest.get("ledger"), dict) else None)
        at = {c[0]: c for c in chain}
        try:
            runs = self.runs()
        except D500Error as err:
            return [*problems, str(err)]
        for run in runs:
            problems += self._run_problems(run, at)
        return problems

    def _run_problems(self, run: ExportedRun, at: dict[int, tuple[int, int, str, str]]
                      ) -> list[str]:
        rid, out = run.origin_id, []
        try:
            recorded = json_value(run.sealed)
        except ValueError:
            recorded = None
        if not isinstance(recorded, dict):
            recorded = {}
            out.append(f"run {rid}: its seal is not a JSON object")
        current = integrity.seal_fields(
            run.row, run.evaluations, run.artifacts, run.trial,
            integrity.LEGACY if integrity.is_legacy(recorded) else run.environment_digest)
        changed = [k for k in (*current, *(k for k in recorded if k not in current))
                   if recorded.get(k) != current.get(k)]
        if changed and recorded:
            out.append(f"run {rid}: {', '.join(changed)} differ from what its seal recorded "
                       "(changed after the run)")
        if integrity.row_hash(run.prev_hash, rid, run.sealed) != run.row_hash:
            out.append(f"run {rid}: row hash does not match its seal")
        link = at.get(run.chain_seq)
        if link is None:
            out.append(f"run {rid}: chain position {run.chain_seq} is not in {CHAIN}")
        elif tuple(link) != (run.chain_seq, rid, run.prev_hash, run.row_hash):
            out.append(f"run {rid}: differs from {CHAIN} at position {run.chain_seq}")
        out += self._log_problems(run)
        digest = run.environment_digest
        env = self._members.get(environment_member(digest)) if digest else None
        if digest is not None and (env is None or sha256(env) != digest):
            out.append(f"run {rid}: its environment {environment_member(digest)} is "
                       + ("missing" if env is None else "not the text its name hashes"))
        want = run.row.get("workload_sha256")
        if want is not None:
            text = self._members.get(run.workload_member or "")
            if text is None:
                out.append(f"run {rid}: the workload file it ran under "
                           f"({run.workload_member}) is missing")
            elif sha256(text) != want:
                out.append(f"run {rid}: {run.workload_member} is not the workload file it "
                           f"ran under (sha256 {sha256(text)[:12]}…, recorded {want[:12]}…)")
        return out

    def submission_problems(self) -> list[str]:
        """Each packed run's recorded submission files (path, sha256) not in the package with
        that content: the entry changed after the run (export warns and packs it; the check
        and the import refuse it)."""
        packed = {rel: sha256(data) for rel, data in self.submission_files().items()}
        out = []
        for run in self.runs():
            for stored, digest in run.submission_file_hashes.items():
                if match_submission_file(stored, str(digest), packed) is None:
                    out.append(f"run {run.origin_id}: submission file {stored} (sha256 "
                               f"{str(digest)[:12]}…) is not in the package as the run used it")
        return out

    def _log_problems(self, run: ExportedRun) -> list[str]:
        """The MLLOG member against the artifact row (path, sha256) the seal covers."""
        stored = run.row.get("mllog")
        if stored is None:
            return []
        if run.mllog_member is None or run.mllog_member not in self._members:
            return [f"run {run.origin_id}: its MLLOG {run.mllog_member} is missing"]
        recorded = [a[1] for a in run.artifacts if a and a[0] == stored]
        if not recorded:
            return []  # a run sealed before its log was an artifact: the manifest covers it
        got = sha256(self._members[run.mllog_member])
        if got != recorded[-1]:
            return [(f"run {run.origin_id}: {run.mllog_member} differs from the MLLOG its "
                     f"seal recorded (sha256 {got[:12]}…, recorded {recorded[-1][:12]}…)")]
        return []

    # ------------------------------------------------------------ files
    def extract(self, dest: str | Path, everything: bool = False) -> Path:
        """Write the files/ tree (everything=True: every member) under `dest`, names with the
        top folder dropped; returns dest/files."""
        dest = Path(dest)
        root = dest.resolve()
        for name, data in sorted(self._members.items()):
            inner = name[len(TOP) + 1:]
            if not everything and not inner.startswith("files/"):
                continue
            target = dest / inner
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
                raise D500Error(f"{self.path}: member {name} would be written outside {dest}")
            target.write_bytes(data)
            target.chmod(0o644)
        return dest / "files"


def match_submission_file(stored: str, sha: str, packed: dict[str, str]) -> str | None:
    """The packed submission file (path relative to the submission folder; `packed` maps each to
    its sha256) a run's recorded one (its stored path and sha256) is: the same content,
    preferring the longest path the recorded one ends with; None when none has its content."""
    same = [rel for rel, digest in packed.items() if digest == sha]
    named = [rel for rel in same if stored == rel or stored.endswith("/" + rel)]
    return max(named, key=len) if named else (same[0] if same else None)


def _links(chain: list[tuple[int, int, str, str]], head: Any) -> list[str]:
    """chain.json's sequence and links from genesis, and its end against the manifest's head."""
    out: list[str] = []
    prev = integrity.GENESIS
    for i, (seq, rid, prev_hash, digest) in enumerate(chain):
        if seq != i + 1:
            out.append(f"{CHAIN}: position {seq} where {i + 1} should be (rows missing or "
                       "reordered)")
            break
        if prev_hash != prev:
            out.append(f"{CHAIN}: the link of run {rid} at position {seq} is broken")
        prev = digest
    last = [chain[-1][0], chain[-1][3]] if chain else None
    if head is not None and head != last:
        out.append(f"{CHAIN}: ends at {last} but the manifest's chain head is {head}")
    return out
