"""d500 package and the package reader, on a real digits entry trained by the shared fixtures: the
members and their hashes, every run and status, deterministic bytes, signatures, refused members,
and tampering caught by member_problems and chain_problems."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest

from d500.competition import signing
from d500.competition.export import build
from d500.competition.package import Package
from d500.errors import D500Error
from d500.ledger import Ledger
from d500.training.seeds import required

from .conftest import ENTRY
from .packages import edit_json, members, raw_tar, repack

TOP = "d500-package"


def _entry_runs(ledger: Path) -> list[dict]:
    with Ledger(ledger) as book:
        return book.runs(submission=ENTRY)


def test_members_and_manifest_hashes(digits_package, digits_ledger, rules_dir, entry_dir):
    found = members(digits_package)
    manifest = json.loads(found[f"{TOP}/manifest.json"])
    listed = manifest.pop("members")
    assert set(listed) == set(found) - {f"{TOP}/manifest.json"}
    for name, digest in listed.items():
        assert hashlib.sha256(found[name]).hexdigest() == digest, name
    runs = _entry_runs(digits_ledger)
    assert manifest["runs"] == [r["id"] for r in runs] == [1, 2, 3, 4, 5, 6]
    assert manifest["entry"] == ENTRY and manifest["format"] == 1
    assert manifest["levels"] == [2] and manifest["workloads"] == ["digits-mlp"]
    assert manifest["backends"] == ["torch"] and manifest["ledger"]["schema"] >= 4
    with sqlite3.connect(digits_ledger) as db:
        head = db.execute("SELECT value FROM meta WHERE key = 'chain_head'").fetchone()[0]
    assert manifest["ledger"]["chain_head"] == [int(head.split()[0]), head.split()[1]]
    workload = rules_dir / "2-training" / "digits-mlp.yaml"
    assert found[f"{TOP}/files/workloads/2-training/digits-mlp.yaml"] == workload.read_bytes()
    for name in ("submission.yaml", "guarded.py"):
        assert found[f"{TOP}/files/submission/{name}"] == (entry_dir / name).read_bytes()
    home = digits_ledger.parent
    for r in runs:
        assert found[f"{TOP}/runs/{r['id']}.mllog.txt"] == (
            home / "runs" / str(r["id"]) / "mllog.txt").read_bytes()
    pkg = Package.open(digits_package)
    assert pkg.sha256 == hashlib.sha256(digits_package.read_bytes()).hexdigest()
    assert pkg.member_problems() == [] and pkg.chain_problems() == []
    assert pkg.signature() is None
    chain = pkg.chain()
    assert [c[0] for c in chain] == list(range(1, len(chain) + 1))
    with tarfile.open(digits_package, "r:gz") as tar:
        assert {(m.mode, m.uid, m.gid) for m in tar} == {(0o644, 0, 0)}


def test_every_run_status_trial_and_study_is_in_the_package(digits_package, digits_ledger):
    pkg = Package.open(digits_package)
    exported = {r.origin_id: r for r in pkg.runs()}
    with Ledger(digits_ledger) as book:
        runs = book.runs(submission=ENTRY)
        studies = {s["id"]: s for s in book.studies()}
        full = {r["id"]: book.get(r["id"]) for r in runs}
    assert set(exported) == {r["id"] for r in runs}
    for r in runs:
        e = exported[r["id"]]
        assert (e.status, e.seed, e.level, e.workload, e.backend, e.submission) == (
            r["status"], r["seed"], r["level"], r["workload"], r["backend"], r["submission"])
        assert e.figures == r["figures"] and e.hyperparameters == r["hyperparameters"]
        assert (e.study, e.number) == (r["study"], r["trial"])
        assert len(e.evaluations) == len(full[r["id"]]["evaluations"])
        assert [json.loads(p[3]) for p in e.evaluations] == [
            v["metrics"] for v in full[r["id"]]["evaluations"]]
        assert e.environment == full[r["id"]]["provenance"]
        assert e.mllog_text.startswith(":::MLLOG ") and "run_stop" in e.mllog_text
    statuses = sorted(e.status for e in exported.values())
    assert statuses == ["diverged", "diverged", "failed", "failed", "succeeded", "succeeded"]
    seeds = [e for e in exported.values() if e.trial is None]
    assert sorted(e.seed for e in seeds) == sorted(required(2, "digits-mlp", ENTRY, "torch", 2))
    assert all(e.figures["epochs"] > 0 for e in seeds)
    trials = sorted((e.study, e.number, e.attempt, e.status) for e in exported.values()
                    if e.trial is not None)
    ids = sorted(studies)
    assert trials == [(ids[0], 0, 0, "diverged"), (ids[0], 1, 0, "failed"),
                      (ids[1], 0, 0, "diverged"), (ids[1], 1, 0, "failed")]
    packed = {s["id"]: s for s in pkg.studies()}
    assert set(packed) == set(ids)
    for sid in ids:
        assert packed[sid]["name"] == studies[sid]["name"]
        assert packed[sid]["search_space"] == studies[sid]["search_space"]


def test_the_same_ledger_gives_the_same_bytes(digits_package, digits_ledger, entry_dir,
                                              tmp_path, signed_package, signing_key):
    again = build(entry_dir, tmp_path / "again.tar.gz", digits_ledger)
    assert again.read_bytes() == digits_package.read_bytes()
    by_file = build(Path(entry_dir) / "submission.yaml", tmp_path / "file.tar.gz", digits_ledger)
    assert by_file.read_bytes() == digits_package.read_bytes()  # the entry's file, as train takes
    signed = build(entry_dir, tmp_path / "signed.tar.gz", digits_ledger, sign_key=signing_key)
    assert signed.read_bytes() == signed_package.read_bytes()  # ed25519 is deterministic


def test_a_new_run_in_the_ledger_changes_the_package(ledger_copy, entry_dir, tmp_path,
                                                     digits_package):
    with Ledger(ledger_copy) as book, book.start_run(level=0, workload="other", submission="x",
                                                     backend="numpy") as run:
        run.record()
    out = build(entry_dir, tmp_path / "later.tar.gz", ledger_copy)
    pkg = Package.open(out)
    assert out.read_bytes() != digits_package.read_bytes()
    assert len(pkg.chain()) == len(Package.open(digits_package).chain()) + 1
    assert [r.origin_id for r in pkg.runs()] == [1, 2, 3, 4, 5, 6]  # other entries stay out
    assert pkg.chain_problems() == []


def test_signature_valid_tampered_and_wrong_key(signed_package, signing_key, tmp_path):
    trusted = signing.public_key(signing.pub_path(signing_key))
    sig = Package.open(signed_package).signature()
    assert sig is not None and sig.valid and sig.public_key == trusted
    assert signing.public_key(signing_key) == trusted  # the private key names the same key

    def flip(found: dict[str, bytes]) -> None:  # one byte of the manifest's "created"
        text = found[f"{TOP}/manifest.json"]
        at = text.index(b'"created": "') + len(b'"created": "')
        found[f"{TOP}/manifest.json"] = text[:at] + bytes([text[at] ^ 1]) + text[at + 1:]
    tampered = Package.open(repack(signed_package, tmp_path / "t.tar.gz", flip, rehash=False))
    assert tampered.member_problems() == []
    assert not tampered.signature().valid
    assert "does not match" in tampered.signature().problem

    def figure(found: dict[str, bytes]) -> None:  # a member changed and the manifest re-hashed
        edit_json(f"{TOP}/runs/1.json", lambda r: r.update(attempt=1))(found)
    rehashed = Package.open(repack(signed_package, tmp_path / "r.tar.gz", figure))
    assert rehashed.member_problems() == [] and not rehashed.signature().valid

    other = tmp_path / "other.key"
    signing.generate(other)
    resigned = Package.open(repack(signed_package, tmp_path / "o.tar.gz", lambda f: f.update({
        f"{TOP}/signature.json": json.dumps(signing.sign(f[f"{TOP}/manifest.json"], other))
        .encode()}), rehash=False))
    sig = resigned.signature()
    assert sig.valid and sig.public_key != trusted  # valid, but not the key the organiser trusts
    forged = Package.open(repack(signed_package, tmp_path / "f.tar.gz", edit_json(
        f"{TOP}/signature.json", lambda s: s.update(public_key=trusted,
                                                    signature=signing.sign(b"x", other)
                                                    ["signature"])), rehash=False))
    assert not forged.signature().valid


@pytest.mark.parametrize("entries, why", [
    ([(f"{TOP}/../../evil.txt", None, b"x")], "'..'"),
    ([("/tmp/evil.txt", None, b"x")], "absolute"),
    ([("elsewhere/evil.txt", None, b"x")], "not under d500-package/"),
    ([(f"{TOP}/files/submission/link", b"/etc/passwd", b"")], "a link"),
    ([(f"{TOP}/manifest.json", None, b"{}"), (f"{TOP}/manifest.json", None, b"{}")],
     "appears twice"),
    ([(f"{TOP}/files/submission/x", None, b"a"), (f"{TOP}/files/submission/x/y", None, b"b")],
     "is a file, not a folder"),
])
def test_unsafe_members_are_refused_in_one_line(tmp_path, entries, why):
    path = raw_tar(tmp_path / "evil.tar.gz", entries)
    with pytest.raises(D500Error) as err:
        Package.open(path)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path.parent / "evil.txt").exists()


def test_not_a_package_is_one_line_exit_2(tmp_path, run_d500, digits_package):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(D500Error, match="not a d500 package"):
        Package.open(text)
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(digits_package.read_bytes()[:2000])
    with pytest.raises(D500Error, match="not a d500 package"):
        Package.open(truncated)
    result = run_d500(tmp_path / "home", "package", str(tmp_path), "--out",
                      str(tmp_path / "p.tar.gz"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_key_file_that_is_a_folder_or_a_key_is_one_line_exit_2(tmp_path, run_d500):
    """`d500 keygen FOLDER` said the folder 'already exists; not overwriting a key'."""
    result = run_d500(tmp_path / "home", "keygen", str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"d500 keygen: error: {tmp_path}: is a folder; KEYFILE takes the private key's file name "
        f"(e.g. {tmp_path / 'me.key'})"], result.stderr
    assert run_d500(tmp_path / "home", "keygen", str(tmp_path / "k")).returncode == 0
    again = run_d500(tmp_path / "home", "keygen", str(tmp_path / "k"))
    assert again.returncode == 2 and "already exists; not overwriting a key" in again.stderr


def test_out_named_for_another_format_is_one_line_exit_2(tmp_path, run_d500):
    """`--out x.zip` wrote a tar.gz under that name: a name that is not .tar.gz or .tgz is
    refused before anything is packed, and nothing is written."""
    for name in ("x.zip", "x.tar", "x"):
        result = run_d500(tmp_path / "home", "package", str(tmp_path), "--out",
                          str(tmp_path / name))
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            f"d500 package: error: {tmp_path / name}: --out writes a gzipped tar: a file name "
            f"ending in .tar.gz or .tgz (e.g. x.tar.gz)"], result.stderr
        assert not (tmp_path / name).exists()


def test_out_that_is_a_folder_is_one_line_exit_2(tmp_path, run_d500):
    """`--out` naming a folder failed only at the end, in a traceback (os.replace onto it)."""
    result = run_d500(tmp_path / "home", "package", str(tmp_path), "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"d500 package: error: {tmp_path}: is a folder; --out takes the package's file name "
        f"(e.g. {tmp_path / 'entry.tar.gz'})"]


def test_a_tampered_figure_is_caught_by_chain_problems(digits_package, tmp_path):
    def faster(run: dict) -> None:
        figures = json.loads(run["row"]["figures"])
        figures["time_to_accuracy"] /= 2
        run["row"]["figures"] = json.dumps(figures, sort_keys=True)
    pkg = Package.open(repack(digits_package, tmp_path / "t.tar.gz",
                              edit_json(f"{TOP}/runs/1.json", faster)))
    assert pkg.member_problems() == []
    assert pkg.chain_problems() == [
        "run 1: figures differ from what its seal recorded (changed after the run)"]

    def resealed(run: dict) -> None:  # and the seal and row hash recomputed to match
        from d500.ledger import integrity
        faster(run)
        seal = integrity.seal_fields(run["row"], run["evaluations"], run["artifacts"],
                                     run["trial"])
        run["sealed"] = json.dumps(seal, sort_keys=True)
        run["row_hash"] = integrity.row_hash(run["prev_hash"], 1, run["sealed"])
    problems = Package.open(repack(digits_package, tmp_path / "s.tar.gz", edit_json(
        f"{TOP}/runs/1.json", resealed))).chain_problems()
    assert problems == ["run 1: differs from d500-package/chain.json at position 1"]


def test_a_tampered_log_line_is_caught(digits_package, tmp_path):
    name = f"{TOP}/runs/2.mllog.txt"

    def edit(found: dict[str, bytes]) -> None:
        lines = found[name].decode().splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if '"key": "eval_accuracy"' in line)
        event = json.loads(lines[at][len(":::MLLOG "):])
        event["value"] = 0.999
        lines[at] = ":::MLLOG " + json.dumps(event) + "\n"
        found[name] = "".join(lines).encode()
    pkg = Package.open(repack(digits_package, tmp_path / "t.tar.gz", edit, rehash=False))
    problems = pkg.member_problems()
    assert len(problems) == 1 and problems[0].startswith(f"{name}: sha256 ")
    rehashed = Package.open(repack(digits_package, tmp_path / "r.tar.gz", edit))
    assert rehashed.member_problems() == []
    assert [p.split(" (")[0] for p in rehashed.chain_problems()] == [
        f"run 2: {name} differs from the MLLOG its seal recorded"]


def test_a_tampered_workload_file_is_caught(digits_package, tmp_path):
    name = f"{TOP}/files/workloads/2-training/digits-mlp.yaml"

    def edit(found: dict[str, bytes]) -> None:
        found[name] = found[name].replace(b"value: 0.97", b"value: 0.90")
    pkg = Package.open(repack(digits_package, tmp_path / "t.tar.gz", edit))
    problems = pkg.chain_problems()
    assert len(problems) == 6 and all(f"{name} is not the workload file" in p for p in problems)


def test_missing_and_unlisted_members(digits_package, tmp_path):
    def edit(found: dict[str, bytes]) -> None:
        del found[f"{TOP}/runs/3.json"]
        found[f"{TOP}/files/submission/extra.py"] = b"print('hi')\n"
    pkg = Package.open(repack(digits_package, tmp_path / "t.tar.gz", edit, rehash=False))
    assert pkg.member_problems() == [
        f"{TOP}/files/submission/extra.py: in the package but not listed in the manifest",
        f"{TOP}/runs/3.json: listed in the manifest but missing",
        f"run 3: listed in the manifest but {TOP}/runs/3.json is missing"]
    with pytest.raises(D500Error, match="no member d500-package/runs/3.json"):
        pkg.runs()


def test_running_rows_refuse_the_build_until_they_end_interrupted(ledger_copy, entry_dir,
                                                                  tmp_path):
    code = ("import sys, time\nfrom d500.ledger import Ledger\n"
            "run = Ledger(sys.argv[1]).start_run(level=2, workload='digits-mlp', "
            f"submission='{ENTRY}', backend='torch', seed=7)\n"
            "print(run.id, flush=True)\ntime.sleep(600)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(ledger_copy)],
                              stdout=subprocess.PIPE, text=True)
    try:
        run_id = int(writer.stdout.readline())
        with pytest.raises(D500Error) as err:
            build(entry_dir, tmp_path / "p.tar.gz", ledger_copy)
        assert f"run(s) {run_id} (digits-mlp seed 7, running, pid {writer.pid}" in str(err.value)
        assert not (tmp_path / "p.tar.gz").exists()
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    pkg = Package.open(build(entry_dir, tmp_path / "p.tar.gz", ledger_copy))
    run = {r.origin_id: r for r in pkg.runs()}[run_id]
    assert run.status == "interrupted" and run.seed == 7
    assert pkg.member_problems() == [] and pkg.chain_problems() == []


def test_changed_submission_files_are_reported(digits_ledger, entry_dir, tmp_path):
    copy = tmp_path / "entry"
    copy.mkdir()
    (copy / "submission.yaml").write_bytes((entry_dir / "submission.yaml").read_bytes())
    (copy / "guarded.py").write_text((entry_dir / "guarded.py").read_text() + "# tuned\n")
    (copy / ".secret").write_text("not packed")
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "guarded.cpython-311.pyc").write_bytes(b"\0")
    warnings: list[str] = []
    pkg = Package.open(build(copy, tmp_path / "p.tar.gz", digits_ledger, warn=warnings.append))
    assert warnings == [("guarded.py: run(s) 1, 2, 3, 4, 5, 6 ran with other content than "
                         "the file packed (changed since)")]
    assert sorted(pkg.submission_files()) == ["guarded.py", "submission.yaml"]
    changed = pkg.submission_problems()  # packed with a warning; the check refuses it
    assert len(changed) == 6 and all("guarded.py" in p for p in changed), changed
    assert pkg.chain_problems() == []


def test_extract_writes_the_files_tree_only_inside_dest(digits_package, tmp_path, entry_dir):
    files = Package.open(digits_package).extract(tmp_path / "out")
    assert files == tmp_path / "out" / "files"
    assert (files / "submission" / "guarded.py").read_bytes() == (
        entry_dir / "guarded.py").read_bytes()
    assert (files / "workloads" / "2-training" / "digits-mlp.yaml").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["files"]


def test_the_cli_packs_signs_and_summarises(digits_home, entry_dir, tmp_path, run_d500,
                                            signing_key):
    out = tmp_path / "entry.tar.gz"
    result = run_d500(digits_home, "package", str(entry_dir), "--out", str(out), "--sign",
                      str(signing_key))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"entry '{ENTRY}', 6 run(s)" in text
    assert "level 2: 6 run(s) (2 seeded, 4 tuning trial(s)): 2 diverged, 2 failed, " \
           "2 succeeded; digits-mlp on torch" in text
    assert f"signed: ed25519 {signing.public_key(signing_key)}" in text
    assert Package.open(out).signature().valid
    again = run_d500(None, "keygen", str(signing_key))
    assert again.returncode == 2 and "already exists" in again.stderr
    blocked = tmp_path / "a-file"  # --out under a file: a NotADirectoryError traceback before
    blocked.write_text("")
    under = run_d500(digits_home, "package", str(entry_dir), "--out", str(blocked / "e.tar.gz"))
    assert under.returncode == 2 and under.stderr.strip().splitlines() == [
        f"d500 package: error: --out {blocked / 'e.tar.gz'}: cannot write it ({blocked} is a "
        f"file, not a folder)"], under.stderr  # said before the runs are read


def test_level3_group_rows_are_packed_with_the_entry(ledger_copy, entry_dir, tmp_path):
    with Ledger(ledger_copy) as book:
        with book.start_run(level=3, workload="digits-mlp-dist", submission=ENTRY,
                            backend="torch", seed=0, group="g1", rank=0, world_size=2) as lead:
            lead.record()
        with book.start_run(level=3, workload="digits-mlp-dist", submission="rank-helper",
                            backend="torch", seed=0, group="g1", rank=1, world_size=2) as rank:
            rank.record()
        with book.start_run(level=3, workload="digits-mlp-dist", submission="rank-helper",
                            backend="torch", seed=0, group="g2", rank=1, world_size=2) as other:
            other.record()
    pkg = Package.open(build(entry_dir, tmp_path / "p.tar.gz", ledger_copy))
    runs = {r.origin_id: r for r in pkg.runs()}
    assert set(runs) == {1, 2, 3, 4, 5, 6, lead.id, rank.id}
    assert (runs[rank.id].group, runs[rank.id].rank, runs[rank.id].world_size) == ("g1", 1, 2)
    assert pkg.manifest["levels"] == [2, 3] and pkg.chain_problems() == []


def test_runs_imported_from_a_package_are_not_packed_again(digits_package, entry_dir, tmp_path,
                                                          rules_dir):
    organiser = tmp_path / "organiser" / "ledger.sqlite"
    with Ledger(organiser) as book:
        book.import_package(digits_package, force=True, rules_dir=rules_dir)
        assert len(book.runs(submission=ENTRY)) == 6
    with pytest.raises(D500Error, match=f"no runs of entry '{ENTRY}'"):
        build(entry_dir, tmp_path / "again.tar.gz", organiser)


def _pax_bomb(path: Path, header_bytes: int) -> Path:
    """A gzip'd tar whose first header is a pax header holding a `header_bytes` comment, written
    in 1 MiB steps (the file is a few hundred kB)."""
    import gzip
    record = " comment="
    body = header_bytes + len(record) + 1
    length = len(str(body)) + body
    length += len(str(length)) - len(str(body))
    pax = tarfile.TarInfo("PaxHeader/manifest.json")
    pax.type, pax.size = tarfile.XHDTYPE, length
    data = tarfile.TarInfo(f"{TOP}/manifest.json")
    data.size = 2
    with gzip.open(path, "wb") as out:
        out.write(pax.tobuf(tarfile.USTAR_FORMAT))
        out.write(f"{length}{record}".encode())
        left = header_bytes
        while left:
            step = min(left, 1 << 20)
            out.write(b"x" * step)
            left -= step
        out.write(b"\n" + b"\0" * (-length % 512))
        out.write(data.tobuf(tarfile.USTAR_FORMAT) + b"{}" + b"\0" * 510 + b"\0" * 1024)
    return path


def test_a_huge_pax_header_is_refused_fast_in_one_line(tmp_path):
    bomb = _pax_bomb(tmp_path / "pax.tar.gz", 50 << 20)
    assert bomb.stat().st_size < 1 << 20
    with tarfile.open(bomb) as tar:
        assert tar.getnames() == [f"{TOP}/manifest.json"]  # a well-formed tar
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(D500Error) as err:
            Package.open(bomb)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert "\n" not in message and "a 50 MiB tar header" in message, message
    assert took < 20 and peak < 160 << 20, (took, peak >> 20)


def test_more_than_max_bytes_decompressed_is_refused(tmp_path, monkeypatch):
    from d500.competition import layout
    path = raw_tar(tmp_path / "big.tar.gz", [(f"{TOP}/manifest.json", None, b"{}"),
                                             (f"{TOP}/files/big", None, b"\0" * (3 << 20))])
    monkeypatch.setattr(layout, "MAX_BYTES", 2 << 20)
    with pytest.raises(D500Error, match="more than 2 MiB once decompressed"):
        Package.open(path)
    monkeypatch.undo()
    with pytest.raises(D500Error, match="not a d500 package|format"):
        Package.open(path)  # under the real limit it is read (and is no package)


def test_a_trusted_key_of_too_few_hex_digits_says_so(tmp_path, monkeypatch):
    """`--trust 1234` said '1234: no such key file'."""
    from d500.competition.check_cli import trusted_key
    from d500.errors import UsageError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^--trust 1234: neither a key file nor an ed25519 "
                                         r"public key's 64 hex digits \(4 given\)$"):
        trusted_key("1234")
    assert trusted_key("AB" * 32) == "ab" * 32
