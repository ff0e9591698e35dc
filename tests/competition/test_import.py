"""`d500 ledger import`: real packages of real digits entries merged into an organiser's ledger,
verified (imported rows in this chain, their origin seals recomputed), tampered with, imported
twice, refused when `d500 check` fails and forced, and ranked by `d500 leaderboard`."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from d500.competition.layout import run_member
from d500.competition.package import Package
from d500.ledger import Ledger

from .conftest import OPTIMIZER, SUBMISSION
from .packages import edit_json, repack

RIVAL = "digits-rival"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def query(ledger: Path, sql: str, *args: object) -> list[tuple]:
    db = sqlite3.connect(ledger)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def execute(ledger: Path, sql: str, *args: object) -> None:
    db = sqlite3.connect(ledger)
    try:
        db.execute(sql, args)
        db.commit()
    finally:
        db.close()


def import_cli(run_d500, home: Path, package: Path, *extra: str):
    return run_d500(home, "ledger", "--ledger", str(home / "ledger.sqlite"), "import",
                    str(package), *extra)


@pytest.fixture(scope="module")
def organiser(tmp_path_factory, run_d500, digits_package, rules_dir) -> Path:
    """A fresh D500_HOME into which the digits package was imported once (copy before edits)."""
    home = tmp_path_factory.mktemp("organiser") / "home"
    done = import_cli(run_d500, home, digits_package, "--rules", str(rules_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    return home


def copy_of(home: Path, tmp_path: Path) -> Path:
    """A copy of an organiser's home this test may change; its ledger file."""
    shutil.copytree(home, tmp_path / "home")
    return tmp_path / "home" / "ledger.sqlite"


def test_a_package_imported_into_a_fresh_ledger_is_whole_and_verifies(
        organiser, digits_package, run_d500):
    pkg = Package.open(digits_package)
    sha12 = pkg.sha256[:12]
    ledger = Ledger(organiser / "ledger.sqlite")
    runs = ledger.runs()
    exported = {r.origin_id: r for r in pkg.runs()}
    assert len(runs) == len(exported) == 6
    assert [r["package"] for r in runs] == [
        {"id": 1, "entry": "digits-packager", "sha256": pkg.sha256, "forced": False}] * 6
    origins = [ledger.get(r["id"])["origin"]["run"] for r in runs]
    assert origins == sorted(exported)  # imported in origin order, one row each
    studies = {s["id"]: s for s in ledger.studies()}
    assert sorted(s["name"] for s in studies.values()) == sorted(
        f"{s['name']} (package {sha12})" for s in pkg.studies())
    assert all(s["package_id"] == 1 for s in studies.values())
    folder = organiser / "packages" / sha12
    for run, origin_id in zip(runs, origins, strict=True):
        source = exported[origin_id]
        full = ledger.get(run["id"])
        # the values the origin sealed, unchanged
        assert (run["status"], run["seed"], run["figures"], run["hyperparameters"],
                run["started_unix"], run["stopped_unix"], run["error"]) == (
            source.status, source.seed, source.figures, source.hyperparameters,
            source.started, source.stopped, source.error)
        assert [[e["step"], e["epoch"], e["wall_time"]] for e in full["evaluations"]] == [
            e[:3] for e in source.evaluations]
        assert [e["metrics"] for e in full["evaluations"]] == [
            json.loads(e[3]) for e in source.evaluations]
        assert full["provenance"] == source.environment
        # trial number and attempt kept, in the study recreated from the package
        if source.trial is None:
            assert run["study"] is None
        else:
            assert run["trial"] == source.number
            assert studies[run["study"]]["name"].endswith(f"(package {sha12})")
            assert query(organiser / "ledger.sqlite", "SELECT attempt FROM trials WHERE "
                         "run_id = ?", run["id"]) == [(source.attempt,)]
        # the MLLOG byte for byte (its d500_run_id stays the origin's), files under packages/
        log = organiser / "runs" / str(run["id"]) / "mllog.txt"
        assert log.read_bytes() == pkg.member(source.mllog_member)
        assert f'"key": "d500_run_id", "value": {origin_id},' in log.read_text()
        assert ledger.resolve_path(run["workload_file"]).is_relative_to(folder)
        assert sha256(ledger.resolve_path(run["workload_file"])) == run["workload_sha256"]
        assert sorted(run["submission_files"].values()) == sorted(
            source.submission_file_hashes.values())
        for stored, digest in run["submission_files"].items():
            assert ledger.resolve_path(stored).is_relative_to(folder / "files" / "submission")
            assert sha256(ledger.resolve_path(stored)) == digest
    assert [p["runs"] for p in ledger.packages()] == [6]
    assert ledger.verify() == []
    ledger.close()
    verified = run_d500(organiser, "ledger", "--ledger", str(organiser / "ledger.sqlite"),
                        "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "intact (6 sealed runs" in verified.stdout
    listed = run_d500(organiser, "ledger", "--ledger", str(organiser / "ledger.sqlite"), "list",
                      "--json")
    assert [r["package"]["sha256"] for r in json.loads(listed.stdout)] == [pkg.sha256] * 6


def test_the_same_package_twice_is_a_no_op(organiser, digits_package, rules_dir, run_d500,
                                           tmp_path):
    ledger = copy_of(organiser, tmp_path)
    tables = ("runs", "evaluations", "artifacts", "trials", "studies", "environments",
              "packages", "origins")
    before = {t: query(ledger, f"SELECT * FROM {t}") for t in tables}
    head = query(ledger, "SELECT value FROM meta WHERE key = 'chain_head'")
    again = import_cli(run_d500, ledger.parent, digits_package, "--rules", str(rules_dir))
    assert again.returncode == 0, again.stderr
    sha12 = sha256(digits_package)[:12]
    assert f"package {sha12} (entry digits-packager) was already imported" in again.stdout
    assert "as package 1 (runs 1..6): nothing to do" in again.stdout
    assert {t: query(ledger, f"SELECT * FROM {t}") for t in tables} == before
    assert query(ledger, "SELECT value FROM meta WHERE key = 'chain_head'") == head
    assert sorted(p.name for p in (ledger.parent / "runs").iterdir()) == [
        str(i) for i in range(1, 7)]


def test_the_same_runs_in_a_rebuilt_package_are_never_imported_twice(
        organiser, digits_package, rules_dir, run_d500, tmp_path):
    """The same members gzipped again (another file, another sha256): every run is already
    held, so the import is refused naming them, and --force imports none of them twice."""
    import gzip

    ledger = copy_of(organiser, tmp_path)
    rebuilt = tmp_path / "rebuilt.tar.gz"
    rebuilt.write_bytes(gzip.compress(gzip.decompress(digits_package.read_bytes()),
                                      compresslevel=1))
    assert sha256(rebuilt) != sha256(digits_package)
    refused = import_cli(run_d500, ledger.parent, rebuilt, "--rules", str(rules_dir))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout.splitlines() == [  # said once, not a line per run
        f"nothing imported into {ledger}: package {sha256(rebuilt)[:12]} (entry "
        "digits-packager) brings no run it lacks; its 6 run(s) are held there already with the "
        f"same origin seal (runs 1..6 here, imported from package {sha256(digits_package)[:12]})"
        "; --verbose names each"], refused.stdout + refused.stderr
    named = import_cli(run_d500, ledger.parent, rebuilt, "--rules", str(rules_dir), "--verbose")
    assert named.returncode == 1 and len(named.stdout.splitlines()) == 7, named.stdout
    assert "run 1: already in this ledger as run 1, imported from package " \
           f"{sha256(digits_package)[:12]}; not imported again" in named.stdout
    forced = import_cli(run_d500, ledger.parent, rebuilt, "--rules", str(rules_dir), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert query(ledger, "SELECT COUNT(*) FROM runs") == [(6,)]
    assert query(ledger, "SELECT COUNT(*) FROM packages") == [(2,)]


def test_a_package_imported_into_the_ledger_it_was_made_from_is_said_once(
        digits_home, digits_package, rules_dir, run_d500, tmp_path):
    """The sender imports its own package into its own ledger: every run is one of the
    ledger's own, so nothing is imported, said in one line (how many, which runs, whose), not
    one line a run; --verbose names each."""
    home = tmp_path / "sender"
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    done = import_cli(run_d500, home, digits_package, "--rules", str(rules_dir))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"nothing imported into {home / 'ledger.sqlite'}: package "
        f"{sha256(digits_package)[:12]} (entry digits-packager) brings no run it lacks; its 6 "
        "run(s) are held there already with the same origin seal (runs 1..6 here, this "
        "ledger's own); --verbose names each"] and not done.stderr, done.stdout + done.stderr
    assert query(home / "ledger.sqlite", "SELECT COUNT(*) FROM packages") == [(0,)]
    named = import_cli(run_d500, home, digits_package, "--rules", str(rules_dir), "--verbose")
    assert [line.split(": ", 1)[1] for line in named.stdout.splitlines()[:6]] == [
        f"run {i}: already in this ledger as run {i}, one of its own runs; not imported again "
        "(the same origin seal)" for i in range(1, 7)], named.stdout


def test_an_edited_entry_name_or_signer_is_named_by_verify(signed_package, rules_dir, tmp_path):
    with Ledger(tmp_path / "home" / "ledger.sqlite") as book:
        book.import_package(signed_package, rules_dir=rules_dir)
    ledger = tmp_path / "home" / "ledger.sqlite"
    execute(ledger, "UPDATE packages SET entry = 'someone-else', signer = NULL")
    with Ledger(ledger) as book:
        problems = book.verify()
    sha12 = sha256(signed_package)[:12]
    assert f"package {sha12}: its entry name changed since import" in problems, problems
    assert f"package {sha12}: its signer changed since import" in problems, problems


def test_a_tampered_imported_figure_is_named_by_verify(organiser, run_d500, tmp_path):
    ledger = copy_of(organiser, tmp_path)
    run_id, origin_id, figures = query(
        ledger, "SELECT r.id, o.origin_id, r.figures FROM runs r JOIN origins o ON "
        "o.run_id = r.id WHERE r.status = 'succeeded' ORDER BY r.id LIMIT 1")[0]
    better = {**json.loads(figures), "epochs": 1.0}
    execute(ledger, "UPDATE runs SET figures = ? WHERE id = ?",
            json.dumps(better, sort_keys=True), run_id)
    found = run_d500(ledger.parent, "ledger", "--ledger", str(ledger), "verify")
    assert found.returncode == 1
    sha12 = query(ledger, "SELECT sha256 FROM packages")[0][0][:12]
    assert found.stdout.splitlines() == [
        f"run {run_id}: figures changed in the database since the run was recorded",
        (f"run {run_id} (origin run {origin_id} of package {sha12}): figures differ from the "
        "origin record")], found.stdout


def test_a_tampered_origin_record_is_named_by_verify(organiser, tmp_path):
    ledger = copy_of(organiser, tmp_path)
    run_id, origin_id, text = query(
        ledger, "SELECT o.run_id, o.origin_id, o.record FROM origins o JOIN runs r ON "
        "r.id = o.run_id WHERE r.status = 'succeeded' ORDER BY o.run_id LIMIT 1")[0]
    record = json.loads(text)
    figures = json.loads(record["row"]["figures"])
    record["row"]["figures"] = json.dumps({**figures, "epochs": 1.0}, sort_keys=True)
    execute(ledger, "UPDATE origins SET record = ? WHERE run_id = ?",
            json.dumps(record, indent=1, sort_keys=True) + "\n", run_id)
    with Ledger(ledger) as book:
        problems = book.verify()
    sha12 = query(ledger, "SELECT sha256 FROM packages")[0][0][:12]
    what = f"run {run_id} (origin run {origin_id} of package {sha12})"
    assert problems == [
        f"{what}: its stored origin record changed since import",
        f"{what}: its origin record is not the one the package manifest lists",
        f"{what}: figures of its origin record do not match the origin's seal",
        f"{what}: figures differ from the origin record"], problems
    # its seal rewritten to match as well: the origin row hash and the chain still say no
    from d500.ledger import integrity
    seal = integrity.seal_fields(record["row"], record["evaluations"], record["artifacts"],
                                 record["trial"])
    record["sealed"] = json.dumps(seal, sort_keys=True)
    execute(ledger, "UPDATE origins SET record = ?, sealed = ? WHERE run_id = ?",
            json.dumps(record), record["sealed"], run_id)
    with Ledger(ledger) as book:
        problems = book.verify()
    assert f"{what}: its origin row hash does not match its origin seal" in problems
    assert f"{what}: its origin row hash is not at position {record['chain_seq']} of the " \
           "package's chain" not in problems  # the hash itself was left: it is in the chain
    assert not any("figures of its origin record" in p for p in problems)


def test_a_package_failing_check_is_refused_then_forced_and_marked(
        digits_package, run_d500, tmp_path):
    """Checked against d500's own rulebook (not the rules the entry ran under), the digits
    package fails `d500 check` on its workload file: refused, nothing imported; --force
    imports it, marked forced with those problems, and the mark is sealed."""
    home = tmp_path / "home"
    ledger = home / "ledger.sqlite"
    check = run_d500(home, "check", str(digits_package))
    assert check.returncode == 1 and check.stdout.strip(), check.stdout + check.stderr
    problems = check.stdout.strip().splitlines()
    refused = import_cli(run_d500, home, digits_package)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout.splitlines() == problems
    assert f"refused package {sha256(digits_package)[:12]} (entry digits-packager): " \
           f"{len(problems)} problem(s); nothing imported" in refused.stderr
    assert query(ledger, "SELECT COUNT(*) FROM runs")[0][0] == 0
    assert query(ledger, "SELECT COUNT(*) FROM packages")[0][0] == 0
    assert not (home / "packages").exists() and not (home / "runs").exists()

    forced = import_cli(run_d500, home, digits_package, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert f"FORCED past {len(problems)} problem(s)" in forced.stdout
    with Ledger(ledger) as book:
        runs = book.runs()
        assert len(runs) == 6 and all(r["package"]["forced"] for r in runs)
        assert [f"{digits_package}: {p}" for p in book.packages()[0]["problems"]] == problems
        assert book.verify() == []
    listed = run_d500(home, "ledger", "--ledger", str(ledger), "list", "--json")
    assert [r["package"]["forced"] for r in json.loads(listed.stdout)] == [True] * 6
    # taking the mark off in the database is caught: each run sealed it
    execute(ledger, "UPDATE packages SET forced = 0")
    found = run_d500(home, "ledger", "--ledger", str(ledger), "verify")
    assert found.returncode == 1
    sha12 = sha256(digits_package)[:12]
    assert found.stdout.splitlines() == [
        (f"package {sha12}: its forced mark changed since import (its runs were sealed "
        "forced)")], found.stdout


def test_a_tampered_package_forced_in_stays_flagged(digits_package, rules_dir, run_d500,
                                                    tmp_path):
    """A figure changed in the package (its manifest re-hashed, as an attacker would): check
    refuses it; forced in, the organiser's chain is intact but verify names the origin run
    whose seal no longer matches, on every verification."""
    pkg = Package.open(digits_package)
    victim = next(r for r in pkg.runs() if r.status == "succeeded")

    def faster(record: dict) -> None:
        record["row"]["figures"] = json.dumps({**victim.figures, "epochs": 1.0},
                                              sort_keys=True)

    tampered = repack(digits_package, tmp_path / "tampered.tar.gz",
                      edit_json(run_member(victim.origin_id), faster))
    home = tmp_path / "home"
    refused = import_cli(run_d500, home, tampered, "--rules", str(rules_dir))
    assert refused.returncode == 1
    assert f"run {victim.origin_id}: figures differ from what its seal recorded" \
           in refused.stdout, refused.stdout
    forced = import_cli(run_d500, home, tampered, "--rules", str(rules_dir), "--force")
    assert forced.returncode == 0, forced.stderr
    with Ledger(home / "ledger.sqlite") as book:
        run_id = next(r["id"] for r in book.runs()
                      if book.get(r["id"])["origin"]["run"] == victim.origin_id)
        assert book.get(run_id)["figures"]["epochs"] == 1.0
        assert book.verify() == [
            (f"run {run_id} (origin run {victim.origin_id} of package "
            f"{sha256(tampered)[:12]}): figures of its origin record do not match the "
            "origin's seal")]


# ------------------------------------------------------------ two entrants, one organiser

@pytest.fixture(scope="module")
def rival_package(tmp_path_factory, run_d500, rules_dir) -> Path:
    """A second entry, its code not the digits entry's, trained in its own D500_HOME (its own
    ledger) and packaged."""
    base = tmp_path_factory.mktemp("rival")
    entry = base / "entry"
    entry.mkdir()
    (entry / "submission.yaml").write_text(
        SUBMISSION.replace("name: digits-packager", f"name: {RIVAL}"))
    # code of its own (its error's words): one code under two names is one entry (same_code)
    (entry / "guarded.py").write_text(OPTIMIZER.replace("submission bug", "the rival's bug"))
    home = base / "home"
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    for args in (("train", workload, "--submission", str(entry), "--seeds", "2"),
                 ("tune", workload, "--submission", str(entry)),
                 ("package", str(entry), "--out", str(base / f"{RIVAL}.tar.gz"))):
        done = run_d500(home, *args)
        assert done.returncode in (0, 1), done.stderr
    assert (base / f"{RIVAL}.tar.gz").is_file()
    return base / f"{RIVAL}.tar.gz"


def test_two_packages_from_two_ledgers_into_a_third_verify_and_rank(
        digits_package, rival_package, rules_dir, run_d500, tmp_path):
    home = tmp_path / "organiser"
    ledger = home / "ledger.sqlite"
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    own = run_d500(home, "train", workload, "--submission", "submissions/sgd-momentum",
                   "--seeds", "1")
    assert own.returncode in (0, 1), own.stderr
    for package in (digits_package, rival_package):
        done = import_cli(run_d500, home, package, "--rules", str(rules_dir))
        assert done.returncode == 0, done.stdout + done.stderr
    with Ledger(ledger) as book:
        runs = book.runs()
        by_entry: dict[object, list[int]] = {}
        for r in runs:
            key = None if r["package"] is None else (r["package"]["id"], r["package"]["entry"])
            by_entry.setdefault(key, []).append(r["id"])
        assert sorted(by_entry, key=str) == sorted(
            [None, (1, "digits-packager"), (2, RIVAL)], key=str)
        assert by_entry[None] == [1]  # the organiser's own run, then the two packages
        assert len(by_entry[(1, "digits-packager")]) == len(by_entry[(2, RIVAL)]) == 6
        assert [p["entry"] for p in book.packages()] == ["digits-packager", RIVAL]
        # every imported row is a link of this ledger's chain after the organiser's own
        seqs = [s for (s,) in query(ledger, "SELECT chain_seq FROM runs ORDER BY id")]
        assert seqs == list(range(1, len(runs) + 1))
        assert book.verify() == []
        names = [s["name"] for s in book.studies()]
        assert len(names) == len(set(names)) == 4  # 2 studies per entry, each named apart
    verified = run_d500(home, "ledger", "--ledger", str(ledger), "verify")
    assert verified.returncode == 0 and "intact (13 sealed runs" in verified.stdout, \
        verified.stdout + verified.stderr
    board = run_d500(home, "leaderboard", "--ledger", str(ledger), "--level", "2")
    assert board.returncode == 0, board.stderr
    text = board.stdout
    for sha, entry in ((sha256(digits_package), "digits-packager"),
                       (sha256(rival_package), RIVAL)):
        assert f"{entry} · package {entry} {sha[:8]}" in text, text
    assert "sgd-momentum" in text and "E1" in text
    assert "forced" not in text


def test_what_is_not_a_package_is_one_line_exit_2(run_d500, tmp_path):
    home = tmp_path / "home"
    notes = tmp_path / "notes.tar.gz"
    notes.write_text("not a package\n")
    for path, says in ((notes, "not a d500 package"), (tmp_path / "gone.tar.gz",
                                                        "no such package file")):
        done = import_cli(run_d500, home, path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_signed_package_records_its_signer(signed_package, rules_dir, tmp_path):
    signature = Package.open(signed_package).signature()
    assert signature is not None and signature.valid
    with Ledger(tmp_path / "home" / "ledger.sqlite") as book:
        done = book.import_package(signed_package, rules_dir=rules_dir)
        assert (done.status, done.forced, len(done.runs)) == ("imported", False, 6)
        assert [(p["signer"], p["forced"], p["problems"]) for p in book.packages()] == [
            (signature.public_key, False, [])]
        assert book.verify() == []


# ------------------------------------------------------------ identity by content

def _renamed(name: str):
    """A replay's edit of one record: the run claimed by the entry `name`."""
    def change(record: dict) -> None:
        record["row"]["submission"] = name
    return change


def _replay(source: Path, dst: Path, name: str, logs: bool = False) -> Path:
    """Another entry's package replayed as `name`'s: every run renamed and re-sealed with
    d500's own functions (tests/competition/packages.py), the manifest's entry renamed; with
    `logs`, each MLLOG's submission_org line edited too (only run_start and seed stay)."""
    from .packages import forge_log, reseal

    ids = [r.origin_id for r in Package.open(source).runs()]

    def edit(found: dict[str, bytes]) -> None:
        for origin_id in ids:
            reseal(origin_id, record=_renamed(name))(found)
            if logs:
                forge_log(origin_id, lambda t: t.replace(
                    '"key": "submission_org", "value": "', '"key": "submission_org", '
                    '"value": "replayed ', 1))(found)
        manifest = json.loads(found["d500-package/manifest.json"])
        manifest["entry"] = name
        found["d500-package/manifest.json"] = json.dumps(manifest).encode()
    return repack(source, dst, edit)


@pytest.mark.parametrize("logs, why", [(False, "the same MLLOG (sha256)"),
                                       (True, "the same run_start and seed in its MLLOG")])
def test_a_replay_of_held_runs_is_refused_and_never_imported(
        organiser, digits_package, rules_dir, run_d500, tmp_path, logs, why):
    ledger = copy_of(organiser, tmp_path)
    replay = _replay(digits_package, tmp_path / "replay.tar.gz", "digits-replay", logs)
    pkg = Package.open(replay)
    assert pkg.chain_problems() == [], pkg.chain_problems()  # a consistent forgery
    assert {r.submission for r in pkg.runs()} == {"digits-replay"}
    refused = import_cli(run_d500, ledger.parent, replay, "--rules", str(rules_dir))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    sha12 = sha256(digits_package)[:12]
    for origin_id in (r.origin_id for r in pkg.runs()):
        assert (f"run {origin_id}: already in this ledger as run {origin_id}, imported from "
                f"package {sha12}; not imported again ({why})") in refused.stdout, refused.stdout
    forced = import_cli(run_d500, ledger.parent, replay, "--rules", str(rules_dir), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert query(ledger, "SELECT COUNT(*) FROM runs") == [(6,)]
    assert query(ledger, "SELECT DISTINCT submission FROM runs") == [("digits-packager",)]


def test_the_same_runs_through_two_packages_are_imported_once(
        signed_package, digits_package, rules_dir, tmp_path):
    """The unsigned and the signed package of one ledger (two files, two sha256): the second
    import finds every run held, with the same seal."""
    with Ledger(tmp_path / "home" / "ledger.sqlite") as book:
        first = book.import_package(digits_package, rules_dir=rules_dir)
        again = book.import_package(signed_package, rules_dir=rules_dir)
        assert (first.status, len(first.runs)) == ("imported", 6)
        assert again.status == "refused" and len(again.problems) == 6, again.problems
        assert all(p.endswith("not imported again (the same origin seal)")
                   for p in again.problems), again.problems
        forced = book.import_package(signed_package, rules_dir=rules_dir, force=True)
        assert (forced.status, forced.runs) == ("imported", {})
        assert len(book.runs()) == 6 and book.verify() == []


# ------------------------------------------------------------ malformed record fields

@pytest.mark.parametrize("change, field", [
    (lambda r: r["row"].update(figures="not json {"), "row.figures"),
    (lambda r: r["row"].update(figures="[1, 2]"), "row.figures"),
    (lambda r: r["row"].update(submission_files="[]"), "row.submission_files"),
    (lambda r: r["row"].update(submission_files="{oops"), "row.submission_files"),
    (lambda r: r.update(environment=12345), "environment"),
    (lambda r: r.update(attempt="x"), "attempt"),
])
def test_a_malformed_record_field_is_one_line_exit_1_nothing_written(
        digits_package, rules_dir, run_d500, tmp_path, change, field):
    run = next(r.origin_id for r in Package.open(digits_package).runs() if r.trial is None)
    bad = repack(digits_package, tmp_path / "bad.tar.gz", edit_json(run_member(run), change))
    home = tmp_path / "home"
    checked = run_d500(home, "check", str(bad), "--rules", str(rules_dir))
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked.stderr
    assert [line for line in checked.stdout.splitlines() if "malformed" in line] == [
        f"{bad}: integrity: {bad}: {run_member(run)}: malformed field(s) {field}"], checked.stdout
    for extra in ((), ("--force",)):
        done = import_cli(run_d500, home, bad, "--rules", str(rules_dir), *extra)
        out = done.stdout + done.stderr
        assert done.returncode == 1 and "Traceback" not in out, out
        lines = done.stderr.splitlines()
        assert done.stdout == "" and len(lines) == 1, out
        assert lines[0].endswith(f"{bad}: run {run}: {run_member(run)}: malformed field(s) "
                                 f"{field}; nothing imported"), out
        assert query(home / "ledger.sqlite", "SELECT COUNT(*) FROM runs") == [(0,)]
        assert not (home / "packages").exists() and not (home / "runs").exists()


# ------------------------------------------------------------ one row per entry, forced apart

@pytest.fixture(scope="module")
def grown_package(tmp_path_factory, run_d500, digits_home, entry_dir, rules_dir) -> Path:
    """The digits entry's second package: its ledger grown by one more run (seed 7, an
    exploration: the required seeds are all run)."""
    base = tmp_path_factory.mktemp("grown")
    home = base / "home"
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    for args in (("train", workload, "--submission", str(entry_dir), "--seed", "7"),
                 ("package", str(entry_dir), "--out", str(base / "grown.tar.gz"))):
        done = run_d500(home, *args)
        assert done.returncode in (0, 1), done.stderr
    assert len(Package.open(base / "grown.tar.gz").runs()) == 7
    return base / "grown.tar.gz"


def board_lines(run_d500, home: Path) -> list[str]:
    board = run_d500(home, "leaderboard", "--ledger", str(home / "ledger.sqlite"), "--level", "2")
    assert board.returncode == 0, board.stderr
    return board.stdout.splitlines()


def test_two_packages_of_one_entry_are_one_row(organiser, grown_package, digits_package,
                                               rules_dir, run_d500, tmp_path):
    """The second package holds the first one's 6 runs (skipped: the same seals) and a new
    one, imported unforced; the board shows the entry once, under its latest package."""
    ledger = copy_of(organiser, tmp_path)
    done = import_cli(run_d500, ledger.parent, grown_package, "--rules", str(rules_dir),
                      "--verbose")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("  skipped run ") == 6 and "FORCED" not in done.stdout, done.stdout
    assert done.stdout.count("  origin run ") == 1, done.stdout
    assert query(ledger, "SELECT COUNT(*), COUNT(DISTINCT package_id) FROM runs") == [(7, 2)]
    with Ledger(ledger) as book:
        assert book.verify() == []
        assert {r["source"]["sha256"] for r in book.runs()} == {sha256(grown_package)}
    rows = [line for line in board_lines(run_d500, ledger.parent)
            if "· package digits-packager" in line]
    pooled = (f"package digits-packager {sha256(grown_package)[:8]} (pooled with 1 earlier "
              "package(s))")
    assert rows and all(pooled in row for row in rows), rows  # tuning, seeds, profile, board
    assert not [row for row in rows if sha256(digits_package)[:8] in row], rows
    ranked = [row for row in rows if row.startswith(("| 1 |", "| — |"))]
    assert len(ranked) == 1, rows


@pytest.mark.parametrize("how", ["100x faster", "one seed of two"])
def test_a_forced_entry_never_outranks_a_complete_one(digits_package, rival_package, rules_dir,
                                                      run_d500, tmp_path, how):
    """The digits entry forged 100x faster (every seed run re-sealed: check refuses it, the
    logs disagree), or packaged with only its faster required seed (the slower one's run left
    out: a missing seed), and forced in; the honest rival is ranked first, the forced row after
    it, unranked, with its mark."""
    from d500.competition.layout import MANIFEST, mllog_member

    from .packages import reseal

    runs = [r for r in Package.open(digits_package).runs() if r.trial is None]
    seeds = [r.origin_id for r in runs]
    slower = max(runs, key=lambda r: r.figures["time_to_accuracy"]).origin_id

    def faster(figures: dict) -> None:
        for key in ("time_to_accuracy", "epochs", "steps"):
            if isinstance(figures.get(key), (int, float)):
                figures[key] = figures[key] / 100

    def edit(found: dict[str, bytes]) -> None:
        if how == "one seed of two":  # its link stays in chain.json, as a hash only
            del found[run_member(slower)], found[mllog_member(slower)]
            manifest = json.loads(found[MANIFEST])
            manifest["runs"] = [r for r in manifest["runs"] if r != slower]
            found[MANIFEST] = json.dumps(manifest).encode()
            return
        for origin_id in seeds:
            reseal(origin_id, faster)(found)
    forged = repack(digits_package, tmp_path / "forged.tar.gz", edit)
    if how == "one seed of two":
        assert len([r for r in Package.open(forged).runs() if r.trial is None]) == 1
    home = tmp_path / "home"
    refused = import_cli(run_d500, home, forged, "--rules", str(rules_dir))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    if how == "one seed of two":
        assert "(of the workload's 2) have no run" in refused.stdout, refused.stdout
    for package, extra in ((forged, ("--force",)), (rival_package, ())):
        done = import_cli(run_d500, home, package, "--rules", str(rules_dir), *extra)
        assert done.returncode == 0, done.stdout + done.stderr
    lines = board_lines(run_d500, home)
    lines = lines[lines.index("### level 2 · digits-mlp"):]  # the ranked board
    rival = next(i for i, line in enumerate(lines) if f"· package {RIVAL}" in line)
    mine = next(i for i, line in enumerate(lines) if "· package digits-packager" in line)
    assert rival < mine, "\n".join(lines)
    assert "forced" in lines[mine] and "forced" not in lines[rival]
    assert lines[rival].lstrip("| ").startswith("1 "), lines[rival]
    assert lines[mine].lstrip("| ").startswith("— "), lines[mine]


def test_a_study_without_a_name_is_one_problem_never_a_traceback(digits_package, rules_dir,
                                                                 tmp_path):
    def nameless(found: dict[str, bytes]) -> None:
        studies = json.loads(found["d500-package/studies.json"])
        del studies[0]["name"]
        found["d500-package/studies.json"] = json.dumps(studies).encode()
    bad = repack(digits_package, tmp_path / "nameless.tar.gz", nameless)
    with Ledger(tmp_path / "home" / "ledger.sqlite") as book:
        refused = book.import_package(bad, rules_dir=rules_dir)
        assert refused.status == "refused" and any(
            p.startswith("studies.json: a study without an integer id or a name")
            for p in refused.problems), refused.problems
        forced = book.import_package(bad, rules_dir=rules_dir, force=True)
        assert (forced.status, len(forced.runs), forced.studies) == ("imported", 6, {})
        assert book.verify() == []


def test_an_import_prints_a_summary_and_each_run_only_with_verbose(
        organiser, grown_package, digits_package, rules_dir, run_d500, tmp_path):
    """Issue 22, item 9: one summary line (and one for the runs skipped), not one line per
    run; `--verbose` adds the mapping of each origin run to its run here."""
    home = tmp_path / "fresh"
    done = import_cli(run_d500, home, digits_package, "--rules", str(rules_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "  origin run " not in done.stdout, lines
    assert lines[0].startswith(f"imported package {sha256(digits_package)[:12]} (entry "
                               f"digits-packager) into ")
    assert ": 6 run(s) (runs 1..6; origin runs 1..6), 2 studies, files under " in lines[0]
    assert lines[1] == "(--verbose maps each origin run to its run here)"
    grown = import_cli(run_d500, copy_of(organiser, tmp_path).parent, grown_package, "--rules",
                       str(rules_dir))
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert grown.stdout.splitlines()[1:] == [
        f"skipped 6 run(s) already held (runs 1..6 here, imported from package "
        f"{sha256(digits_package)[:12]}; --verbose names each, and maps each origin run to its "
        "run here)"], grown.stdout
