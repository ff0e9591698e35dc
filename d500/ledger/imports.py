"""`d500 ledger import`: a competitor's package (d500.competition.package) merged into this ledger.

    from d500.ledger.imports import import_package
    done = import_package(ledger, "entry.d500.tgz", force=False, rules_dir=None)
    done.status            # "imported", "already" (the same package: nothing written) or
                           # "refused" (problems and no force: nothing written)
    done.problems, done.runs ({origin run id: run id here}), done.studies, done.package_id

Every exported run becomes an ordinary sealed row of this ledger's chain, so `d500 ledger
verify` covers it: the values its origin ledger sealed (figures, times, status, seed, host,
workload text, hyperparameters, ... as stored text) copied unchanged, its provenance stored as
the package carries it, its evaluations, its trial number and attempt in a study recreated here
(named "<name> (package <sha12>)", studies.package_id set), its group renamed the same way and
its parent mapped to the parent's new id (None when the parent was not packed). The row also
seals its link to the package (runs.package_id and runs.origin: the sha256 of the package, its
manifest, the exported record, the problems, and the forced mark), and the exported record
itself is kept in `origins` with the origin's chain position, seal and row hash, which
d500.ledger.origins recomputes on every verification.

Files go under <ledger folder>/packages/<sha12>/files/ (the ledger folder is $D500_HOME for
the default ledger; Package.extract's tree): the submission's files and the workload files,
which the row's submission_files and workload_file name so verify re-hashes them. A run's MLLOG
is written byte for byte to runs/<new id>/mllog.txt: its `d500_run_id` line keeps the ORIGIN
run id, since the log is the entrant's evidence (the origin row sealed its sha256, which the
copy keeps); the origin id is also in the `origins` row. Other artifacts (model weights, ...)
are not packed and stay named in the origin record only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from d500 import metrics as _metrics
from d500.competition.layout import (
    CHAIN,
    MANIFEST,
    environment_member,
    is_int,
    malformed,
    run_member,
)
from d500.errors import CheckFailed, D500Error
from d500.ledger import integrity
from d500.ledger.lifecycle import FINAL, environment_id
from d500.ledger.origins import COPIED
from d500.ledger.relay import insert_row, seal_with_log
from d500.ledger.sameness import WHY, Held, run_keys
from d500.ledger.store import dumps
from d500.untrusted import json_value

if TYPE_CHECKING:
    from d500.competition.package import Package
    from d500.ledger.core import Ledger


@dataclass
class Imported:
    """What `import_package` did."""

    status: str  # imported | already | refused
    sha256: str
    entry: str
    problems: list[str] = field(default_factory=list)
    forced: bool = False
    package_id: int | None = None
    runs: dict[int, int] = field(default_factory=dict)  # origin run id -> run id here
    studies: dict[int, int] = field(default_factory=dict)  # origin study id -> id here (new)
    folder: Path | None = None
    imported: float | None = None  # unix time of the import (the first one, if `already`)
    skipped: list[str] = field(default_factory=list)  # runs held already, with the same seal
    held: dict[int, str] = field(default_factory=dict)  # theirs here -> the package (sha12) it
    # came in, "" for this ledger's own runs (a package made here, imported here)
    same_code: str = ""  # its code is an entry's of another name imported first: that line


@dataclass
class _Planned:
    """One exported run, read and matched to the files it will name here."""

    origin_id: int
    text: str  # runs/<id>.json exactly as packed
    record: dict[str, Any]
    environment: str  # provenance text
    workload_file: str | None  # path inside the package folder
    submission_files: dict[str, str]  # path inside the package folder -> sha256
    mllog: bytes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_folder(ledger: Ledger, sha256: str) -> Path:
    """Where a package's files go: <ledger folder>/packages/<first 12 hex digits>/."""
    return ledger.root / "packages" / sha256[:12]


def check_problems(pkg: Package, rules_dir: str | Path | None = None) -> list[str]:
    """What `d500 check` finds wrong with the package (empty: it passes)."""
    from d500.competition.check import check_package

    return list(check_package(pkg, rules_dir=None if rules_dir is None else Path(rules_dir)))


def import_package(ledger: Ledger, package: str | Path | Package, *, force: bool = False,
                   rules_dir: str | Path | None = None,
                   problems: list[str] | None = None) -> Imported:
    """Merge a package into the ledger (see the module docstring). `problems` are the check's
    when the caller ran it already; otherwise `check_problems` runs here. A package with
    problems (the check's or the import's own: a packed run unsealed, a file its row names not
    packed) is refused unless `force`, which imports it marked forced with them."""
    from d500.competition.package import Package

    pkg = package if isinstance(package, Package) else Package.open(package)
    entry = str(pkg.manifest.get("entry", ""))
    if (already := _already(ledger, pkg.sha256, entry)) is not None:
        return already
    found_problems = list(check_problems(pkg, rules_dir) if problems is None else problems)
    planned, studies, own = _plan(pkg)
    found_problems += own
    planned, twice, same = _new_runs(ledger, planned)
    skipped, held = [line for line, _, _ in same], {run: sha for _, run, sha in same}
    found_problems += twice if planned or not skipped else twice + skipped
    if found_problems and not force:
        return Imported("refused", pkg.sha256, entry, found_problems,
                        skipped=[] if planned else skipped, held={} if planned else held)
    skipped, held = (skipped, held) if planned else ([], {})
    folder = package_folder(ledger, pkg.sha256)
    existed = folder.exists()
    written: list[Path] = []
    try:
        pkg.extract(folder)
        done = _write(ledger, pkg, entry, planned, studies, found_problems,
                      bool(found_problems), folder, written)
    except _ImportedMeanwhile:
        return _already(ledger, pkg.sha256, entry)  # type: ignore[return-value]
    except BaseException:
        for path in written:
            shutil.rmtree(path, ignore_errors=True)
        if not existed:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    done.skipped, done.held = skipped, held
    from d500.competition import same_code
    if (copy := same_code.first_of(ledger, pkg)) is not None:
        done.same_code = same_code.line(entry, copy)
    return done


def _new_runs(ledger: Ledger, planned: list[_Planned]
              ) -> tuple[list[_Planned], list[str], list[tuple[str, int, str]]]:
    """The planned runs this ledger does not hold yet; one problem per run it already holds
    under another seal (d500.ledger.sameness: the same MLLOG, or run_start and seed: another
    entry's runs renamed and re-sealed) or that repeats an earlier run of the same package;
    and per run held with the same origin seal (the entry's package rebuilt, re-signed or grown
    by runs, or made from this very ledger: skipped, a problem only when the package brings
    nothing new) its line, its id here and the package it came in (sha12; "": its own).
    Held runs are never imported again, even with --force."""
    with ledger._snapshot() as db:
        held = Held.read(db, ledger.resolve_path, (p.record["row"].get("seed") for p in planned))
    own = Held()
    fresh: list[_Planned] = []
    twice: list[str] = []
    same: list[tuple[str, int, str]] = []
    for p in planned:
        keys = run_keys(p.record.get("sealed"), p.mllog, p.record["row"].get("workload"),
                        p.record["row"].get("rank"))
        found = held.find(keys)
        again = own.find(keys)
        if found is not None:
            run_id, sha, why = found
            source = f"imported from package {sha[:12]}" if sha else "one of its own runs"
            line = (f"run {p.origin_id}: already in this ledger as run {run_id}, {source}; not "
                    f"imported again ({why})")
            if why == WHY["seal"]:
                same.append((line, run_id, (sha or "")[:12]))
            else:
                twice.append(line)
        elif again is not None:
            twice.append(f"run {p.origin_id}: {again[2]} as run {again[0]} of this package; "
                         "not imported twice")
        else:
            fresh.append(p)
        own.add(keys, p.origin_id, None)
    return fresh, twice, same


class _ImportedMeanwhile(Exception):
    """Another process imported the same package while this one read it."""


def _already(ledger: Ledger, sha256: str, entry: str) -> Imported | None:
    """The import of this package done before, None if there was none."""
    with ledger._snapshot() as db:
        found = db.execute("SELECT id, imported, forced, problems FROM packages "
                           "WHERE sha256 = ?", (sha256,)).fetchone()
        if found is None:
            return None
        runs = {r[0]: r[1] for r in db.execute(
            "SELECT origin_id, run_id FROM origins WHERE package_id = ? ORDER BY origin_id",
            (found[0],))}
    return Imported("already", sha256, entry, json.loads(found[3]), bool(found[2]),
                    found[0], runs, {}, package_folder(ledger, sha256), found[1])


def _member(pkg: Package, name: str) -> bytes | None:
    try:
        return pkg.member(name)
    except (D500Error, KeyError):
        return None


def _plan(pkg: Package) -> tuple[list[_Planned], list[dict[str, Any]], list[str]]:
    """Every packed run read and matched to the packed files, the studies, and the problems
    that stop or limit their import."""
    from d500.competition.package import match_submission_file

    problems: list[str] = []
    submission = {rel: _sha(data) for rel, data in pkg.submission_files().items()}
    workloads = {_sha(data): rel for rel, data in pkg.workload_files().items()}
    try:
        studies = pkg.studies()
        odd = [st for st in studies if not (is_int(st.get("id")) and isinstance(st.get("name"),
                                                                                 str))]
        if odd:
            raise ValueError(f"a study without an integer id or a name ({str(odd[0])[:60]})")
        study_ids = {int(st["id"]) for st in studies}
    except (D500Error, KeyError, TypeError, ValueError) as err:
        problems.append(f"studies.json: {err}; runs imported without their trial links")
        studies, study_ids = [], set()
    planned = []
    for origin_id in sorted(int(i) for i in pkg.manifest.get("runs", [])):
        where = f"run {origin_id}"
        raw = _member(pkg, run_member(origin_id))
        try:
            text = raw.decode() if raw is not None else ""
            record = json_value(text)
        except (UnicodeDecodeError, ValueError):
            problems.append(f"{where}: runs/{origin_id}.json is missing or not JSON; "
                            "not imported")
            continue
        bad = malformed(record) if isinstance(record, dict) else ["the record itself"]
        if isinstance(record, dict) and record.get("attempt") is not None \
                and not is_int(record["attempt"]):
            bad.append("attempt")
        if bad:
            raise CheckFailed(f"{pkg.path}: {where}: {run_member(origin_id)}: malformed "
                              f"field(s) {', '.join(bad)}; nothing imported")
        row = record.get("row") if isinstance(record, dict) else None
        if not isinstance(row, dict) or row.get("status") not in FINAL:
            status = row.get("status") if isinstance(row, dict) else None
            problems.append(f"{where}: status '{status}' is not a final status (still running "
                            "when packed?); not imported")
            continue
        if not (isinstance(record.get("chain_seq"), int) and all(
                isinstance(record.get(k), str) for k in ("prev_hash", "sealed", "row_hash"))):
            problems.append(f"{where}: no chain position, seal or row hash in its record; "
                            "not imported")
            continue
        trial = record.get("trial")
        if trial is not None and (not isinstance(trial, list) or len(trial) != 3
                                  or not isinstance(trial[0], int) or trial[0] not in study_ids):
            problems.append(f"{where}: a trial of study {trial and trial[0]}, which "
                            "studies.json does not hold; imported without its trial link")
        for name in json.loads(row.get("figures") or "{}"):
            try:
                _metrics.get(name)
            except D500Error:
                problems.append(f"{where}: figure '{name}' is not a metric this d500 defines")
        digest = str(record.get("environment"))
        env = _member(pkg, environment_member(digest))
        env_text = env.decode() if env is not None else ""
        if env is None or integrity.sha(env_text) != digest:
            problems.append(f"{where}: its provenance environments/{digest}.json is missing "
                            "or does not hash to its name")
        workload = workloads.get(row.get("workload_sha256") or "")
        if workload is None and row.get("workload_sha256"):
            problems.append(f"{where}: its workload file (sha256 {row['workload_sha256'][:12]}"
                            "…) is not in the package")
        files = {}
        for stored, sha in json.loads(row.get("submission_files") or "{}").items():
            rel = match_submission_file(stored, sha, submission)
            if rel is None:
                problems.append(f"{where}: submission file {stored} (sha256 {sha[:12]}…) is "
                                "not in the package as the run used it")
            else:
                files[f"files/submission/{rel}"] = sha
        log = _member(pkg, str(record.get("mllog")))
        if log is None:
            problems.append(f"{where}: its MLLOG {record.get('mllog')} is missing; not imported")
            continue
        planned.append(_Planned(origin_id, text, record, env_text,
                                None if workload is None else f"files/workloads/{workload}", files,
                                log))
    return planned, studies, problems


def _write(ledger: Ledger, pkg: Package, entry: str, planned: list[_Planned],
           studies: list[dict[str, Any]], problems: list[str], forced: bool, folder: Path,
           written: list[Path]) -> Imported:
    """One write transaction: the packages row, the studies, every run sealed with its origin."""
    sha12 = pkg.sha256[:12]
    manifest_text = pkg.member(MANIFEST).decode()
    chain_text = (_member(pkg, CHAIN) or b"[]").decode()
    signature = pkg.signature()
    signer = signature.public_key if signature is not None and signature.valid else None
    problems_text = dumps(problems)
    now = time.time()
    done = Imported("imported", pkg.sha256, entry, problems, forced, folder=folder,
                    imported=now)
    with ledger._write() as db:
        if db.execute("SELECT 1 FROM packages WHERE sha256 = ?", (pkg.sha256,)).fetchone():
            raise _ImportedMeanwhile
        cur = db.execute("INSERT INTO packages (sha256, entry, manifest, signer, imported, "
                         "forced, problems, chain) VALUES (?,?,?,?,?,?,?,?)",
                         (pkg.sha256, entry, manifest_text, signer, now, int(forced),
                          problems_text, chain_text))
        package_id = done.package_id = int(cur.lastrowid)  # type: ignore[arg-type]
        for study in studies:
            done.studies[int(study["id"])] = _study(db, study, package_id, sha12)
        link = {"package": pkg.sha256, "manifest": integrity.sha(manifest_text),
                "forced": forced, "problems": integrity.sha(problems_text), "entry": entry,
                "signer": signer, "imported": now}
        for p in planned:
            row, record = p.record["row"], p.record
            group = row.get("run_group")
            parent = row.get("parent_run")
            columns = {name: row.get(name) for name in COPIED}
            columns.update(
                env_id=environment_id(db, p.environment),
                workload_file=None if p.workload_file is None
                else ledger.store_path(folder / p.workload_file),
                model_file=None,
                submission_files=dumps({ledger.store_path(folder / rel): sha
                                        for rel, sha in p.submission_files.items()}),
                run_group=None if group is None else f"{group} (package {sha12})",
                parent_run=done.runs.get(parent) if parent is not None else None,
                package_id=package_id,
                origin=dumps({**link, "run": p.origin_id, "record": integrity.sha(p.text)}))
            evaluations = [tuple(e) for e in record.get("evaluations") or []]
            run_id = insert_row(db, columns, evaluations)
            done.runs[p.origin_id] = run_id
            trial = record.get("trial")
            if isinstance(trial, list) and len(trial) == 3 and trial[0] in done.studies:
                db.execute("INSERT INTO trials (study_id, number, run_id, params, attempt) "
                           "VALUES (?,?,?,?,?)", (done.studies[trial[0]], trial[1],
                                                  run_id, trial[2], record.get("attempt") or 0))
            run_dir = ledger.root / "runs" / str(run_id)
            written.append(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            log_path = run_dir / "mllog.txt"
            log_path.write_bytes(p.mllog)
            seal_with_log(ledger, db, run_id, [], log_path)
            db.execute("INSERT INTO origins (run_id, package_id, origin_id, chain_seq, "
                       "prev_hash, sealed, row_hash, record) VALUES (?,?,?,?,?,?,?,?)",
                       (run_id, package_id, p.origin_id, record["chain_seq"],
                        record["prev_hash"], record["sealed"], record["row_hash"], p.text))
    return done


def _study(db: Any, study: dict[str, Any], package_id: int, sha12: str) -> int:
    """A packed study recreated here, its name marking the package it came from."""
    def text(key: str) -> str | None:
        value = study.get(key)
        return value if value is None or isinstance(value, str) else dumps(value)

    cur = db.execute(
        "INSERT INTO studies (name, level, workload, submission, backend, objective,"
        " search_space, budget, status, started, stopped, details, package_id)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (f"{study['name']} (package {sha12})", study.get("level"), study.get("workload"),
         study.get("submission"), study.get("backend"), study.get("objective"),
         text("search_space"), text("budget"), study.get("status") or "succeeded",
         study.get("started") or 0.0, study.get("stopped"), text("details"), package_id))
    return int(cur.lastrowid)  # type: ignore[arg-type]
