"""The attacks on the rules' seeds that level 2's and level 3's tests perform alike
(tests/competition/test_seeds.py, tests/distributed/test_seeds_mpi.py): runs' rows deleted from
the ledger and the chain re-linked, and a job SIGKILLed from outside once its run is under way."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from d500.competition.package import Package
from d500.ledger import integrity


def delete_and_relink(ledger: Path, run_ids: list[int]) -> None:
    """What a sender with the ledger can do: delete runs' rows and re-make every later link of
    the chain and its head with d500's own row hash, so that the chain verifies again."""
    db = sqlite3.connect(ledger)
    with db:
        for rid in run_ids:
            for table in ("evaluations", "artifacts", "trials"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
            db.execute("DELETE FROM runs WHERE id = ?", (rid,))
        rows = db.execute("SELECT id, sealed FROM runs WHERE chain_seq IS NOT NULL "
                          "ORDER BY chain_seq").fetchall()
        prev = integrity.GENESIS
        for seq, (rid, sealed) in enumerate(rows, 1):
            digest = integrity.row_hash(prev, rid, sealed)
            db.execute("UPDATE runs SET chain_seq = ?, prev_hash = ?, row_hash = ? WHERE id = ?",
                       (seq, prev, digest, rid))
            prev = digest
        db.execute("INSERT OR REPLACE INTO meta VALUES ('chain_head', ?)",
                   (f"{len(rows)} {prev}",))
    db.close()


def package(run_d500: Callable[..., subprocess.CompletedProcess], home: Path, entry: Path,
            out: Path) -> Package:
    """`d500 package` of `entry` with the ledger in `home` (`run_d500(home, *args)` runs d500)."""
    done = run_d500(home, "package", str(entry), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return Package.open(out)


def kill_once_evaluated(argv: list[str], cwd: Path, env: dict[str, str], ledger: Path,
                        seed: int, deadline: float) -> None:
    """Run `argv` in a session of its own and SIGKILL the whole session (a supervisor and its
    worker; mpiexec and every rank) once a run of `seed` is under way (`evaluated`), within
    `deadline` s."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + deadline
        while not evaluated(ledger, seed):
            assert proc.poll() is None and time.monotonic() < end, f"seed {seed} never started"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def evaluated(ledger: Path, seed: int) -> bool:
    """Whether a run of `seed` is running and has made an evaluation (well under way): its
    MLLOG holds an eval_stop (the ledger's rows come after the run, d500.training.heldout)."""
    if not ledger.exists():
        return False
    try:
        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5)
        try:
            ids = [r[0] for r in db.execute("SELECT id FROM runs WHERE seed = ? AND status = "
                                            "'running'", (seed,))]
        finally:
            db.close()
    except sqlite3.Error:
        return False
    for run_id in ids:
        log = ledger.parent / "runs" / str(run_id) / "mllog.txt"
        try:
            if '"key": "eval_stop"' in log.read_text():
                return True
        except OSError:
            pass
    return False
