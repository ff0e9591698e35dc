"""Shared fixtures of the competition tests: one real digits entry, trained once per session with
the real `d500 train` and `d500 tune` commands into its own ledger, and packaged with
`d500 package`.

    rules_dir       a rules folder laid out like levels/: 2-training/digits-mlp.yaml is the
                    rulebook's file with `seeds: 2`, `tuning: {studies: 2, trials: 2, seed: 0}` and
                    `budget: {max_epochs: 8, max_seconds: 120}` (pass it as `--rules`)
    entry_dir       the entry `digits-packager` (submission.yaml + guarded.py, a momentum SGD
                    whose `fail_at` hyperparameter raises at that step); its feasible points make
                    each study's trial 0 diverge (lr 1e6) and trial 1 fail (fail_at 3)
    digits_home     the D500_HOME the entry was trained in (runs/<id>/mllog.txt live there)
    digits_ledger   digits_home/ledger.sqlite: runs 1-2 the seeds 0 and 1 (succeeded, 6 epochs
                    each on torch when measured), runs 3-6 the trials (diverged, failed, diverged,
                    failed) of studies 1 and 2
    digits_package  the package of entry_dir built from digits_ledger (unsigned)
    organiser       a folder: org/ an organiser's home that imported the digits package and
                    re-ran it at 5 drawn seeds (`d500 reproduce --fresh-seeds 5 --seed 7 --json`:
                    reproduce.json, reproduce.rc), digits-packager.tar.gz that package
    signing_key     an ed25519 key made by `d500 keygen` (its public key: signing_key.pub)
    signed_package  the same package signed with signing_key
    ledger_copy     (per test) a copy of digits_home to change: returns its ledger file
    run_d500        run_d500(home, *args, cwd=None) -> CompletedProcess of `d500 ARGS`
    repack          tests/competition/packages.py: repack(src, dst, edit, rehash=True)

The session fixtures are shared: never change them in place (copy with ledger_copy, repack).
Measured on the 2-core machine while others worked: 20-55 s for training and tuning (two torch
start-ups and 6 short runs; the seeds reach the target in 6 epochs, well inside the budget; at
load 6, 34-54 s with the runs' workers forked, as the test session does, 56-80 s spawned),
under 1 s for packaging. Under pytest-xdist the rules, the entry and the trained home are built
once for all workers (the first to ask builds, under a file lock the others wait on); each
worker's digits_home is its own copy, and each checks at its end that nothing changed the
shared build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from d500.paths import rulebook
from tests.helpers import seed_peak

from .packages import repack as _repack

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "digits-packager"
WORKLOAD_CHANGES = {  # field -> the line that replaces it in the rulebook's digits-mlp.yaml
    "seeds": "seeds: 2",
    "tuning": "tuning: {studies: 2, trials: 2, seed: 0}",
    "budget": "budget: {max_epochs: 8, max_seconds: 120}",
}
ORGANISER_DRAW = 7  # the organiser fixture's draw seed (fixed, so that its runs are fixed)
SUBMISSION = """\
name: digits-packager
level: 2
description: Momentum SGD on the digits, the entry the competition tests pack.
authors: [d500 tests]
workloads: [digits-mlp]
optimizer: guarded.py:Guarded
batch_size: 32
hyperparameters: {lr: 0.05, momentum: 0.9}
schedule: {name: cosine, warmup: 0.05}
feasible_points:
  - {lr: 1.0e+6}
  - {fail_at: 3}
"""
OPTIMIZER = '''\
"""Momentum SGD with a bug that shows only when asked (`fail_at`): a tuning trial that fails."""

from d500.training.optimizers import Hyper
from d500.training.optimizers.sgd import Momentum


class Guarded(Momentum):
    name = "guarded"
    hyperparameters = {**Momentum.hyperparameters,
                       "fail_at": Hyper(0.0, "nonnegative", "raise at this step (0: never)")}

    def update(self, ops, params, grads, state, lr, t):
        if self.fail_at and int(t) >= self.fail_at:
            raise RuntimeError(f"submission bug at step {int(t)}")
        super().update(ops, params, grads, state, lr, t)
'''


def d500(home: Path | None, *args: str, cwd: Path | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    """`d500 ARGS` in a fresh process with D500_HOME=home (None: as set)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if home is not None:
        env["D500_HOME"] = str(home)
        seed_peak(home)  # the session's peak FLOP/s, not measured again in every fresh home
    env.pop("D500_DATA", None)
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], check=False,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT,
                          env=env)


def _ok(result: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    assert result.returncode in (0, 1), f"{what}: exit {result.returncode}\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def run_d500() -> Callable[..., subprocess.CompletedProcess]:
    return d500


@pytest.fixture(scope="session")
def repack() -> Callable[..., Path]:
    return _repack


@pytest.fixture(scope="session")
def competition_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("competition")


def _rules(folder: Path) -> Path:
    text = (rulebook() / "2-training" / "digits-mlp.yaml").read_text()
    for field, line in WORKLOAD_CHANGES.items():
        text, n = re.subn(rf"(?m)^{field}:.*$", line, text)
        assert n == 1, f"the rulebook's digits-mlp.yaml has no one-line '{field}:' any more"
    (folder / "2-training").mkdir(parents=True)
    (folder / "2-training" / "digits-mlp.yaml").write_text(text)
    return folder


def _entry(folder: Path) -> Path:
    folder.mkdir()
    (folder / "submission.yaml").write_text(SUBMISSION)
    (folder / "guarded.py").write_text(OPTIMIZER)
    return folder


def _train(home: Path, rules: Path, entry: Path) -> Path:
    workload = str(rules / "2-training" / "digits-mlp.yaml")
    t0 = time.perf_counter()
    # one thread (not the idle cores of the moment): a reproduction re-runs at the recorded
    # count, and two threads re-run beside the other xdist worker's tests are oversubscribed
    one = ("--threads", "1")
    train = _ok(d500(home, "train", workload, "--submission", str(entry), "--seeds", "2",
                     *one, "--json"), "d500 train")
    tune = _ok(d500(home, "tune", workload, "--submission", str(entry), *one, "--json"),
               "d500 tune")
    took = time.perf_counter() - t0
    print(f"\n[competition fixture] digits entry trained and tuned in {took:.1f} s")
    assert '"status"' in train.stdout and '"ran"' in tune.stdout
    return home


def _digest(folder: Path) -> str:
    """The hash of every file's path and bytes under folder (its own sha256 file left out)."""
    sha = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / "sha256"
                       and "__pycache__" not in p.parts):  # an import may write bytecode
        sha.update(f"{path.relative_to(folder)}\0".encode() + path.read_bytes())
    return sha.hexdigest()


def _build(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)  # without xdist: mktemp made it
    _train(folder / "home", _rules(folder / "rules"), _entry(folder / "entry"))
    (folder / "sha256").write_text(_digest(folder))  # written last: the build is complete


def _once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]):
    """The folder `name` built by `build(folder)` once per session: under xdist, once for all
    workers in the run's shared temporary folder (the first to ask builds, under a file lock the
    others wait on); a worker checks at its end that it is as built."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = factory.mktemp(name)
        build(folder)
    else:
        root = factory.getbasetemp().parent  # one per run, the workers' temps below it
        folder = root / f"competition-{name}"
        with open(root / f"competition-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not (folder / "sha256").exists():
                shutil.rmtree(folder, ignore_errors=True)  # a worker's failed build
                build(folder)
    sha = (folder / "sha256").read_text()
    yield folder
    assert _digest(folder) == sha, f"a test changed the shared competition build {folder}"


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory):
    """rules/, entry/ and home/ (trained), built once per session for all workers."""
    yield from _once(tmp_path_factory, "built", _build)


def _organise(built: Path) -> Callable[[Path], None]:
    """The organiser fixture's build: the digits package imported and re-run at drawn seeds."""
    def build(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        home = Path(shutil.copytree(built / "home", folder / "sender"))
        package = folder / "digits-packager.tar.gz"
        _ok(d500(home, "package", str(built / "entry"), "--out", str(package)), "d500 package")
        rules = ("--rules", str(built / "rules"))
        imported = d500(folder / "org", "ledger", "import", str(package), *rules)
        assert imported.returncode == 0, imported.stdout + imported.stderr
        (folder / "import.txt").write_text(imported.stdout)
        done = _ok(d500(folder / "org", "reproduce", str(package), "--fresh-seeds", "5", "--seed",
                        str(ORGANISER_DRAW), *rules, "--json"), "d500 reproduce")
        (folder / "reproduce.json").write_text(done.stdout)
        (folder / "reproduce.rc").write_text(str(done.returncode))
        shutil.rmtree(folder / "org" / "cache", ignore_errors=True)
        (folder / "sha256").write_text(_digest(folder))  # written last: the build is complete
    return build


@pytest.fixture(scope="session")
def organiser(tmp_path_factory: pytest.TempPathFactory, built: Path):
    """The organiser's side of the digits entry, built once per session for all workers:
    org/ a D500_HOME whose ledger imported the digits package (import.txt: what import said) and
    re-ran it at 5 seeds drawn with draw seed ORGANISER_DRAW (`d500 reproduce --fresh-seeds 5
    --json`: reproduce.json, its exit code reproduce.rc); digits-packager.tar.gz that package
    (built from a copy of the trained home, sender/). Copy org/ to change it."""
    yield from _once(tmp_path_factory, "organiser", _organise(built))


@pytest.fixture(scope="session")
def rules_dir(built: Path) -> Path:
    return built / "rules"


@pytest.fixture(scope="session")
def entry_dir(built: Path) -> Path:
    return built / "entry"


@pytest.fixture(scope="session")
def digits_home(built: Path, competition_dir: Path) -> Path:
    """This worker's copy of the trained home (`d500 package` on it may write its cache)."""
    return Path(shutil.copytree(built / "home", competition_dir / "home"))


@pytest.fixture(scope="session")
def digits_ledger(digits_home: Path) -> Path:
    return digits_home / "ledger.sqlite"


@pytest.fixture(scope="session")
def digits_package(digits_home: Path, entry_dir: Path, competition_dir: Path) -> Path:
    out = competition_dir / "digits-packager.tar.gz"
    result = d500(digits_home, "package", str(entry_dir), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def signing_key(competition_dir: Path) -> Path:
    key = competition_dir / "keys" / "entrant.key"
    result = d500(None, "keygen", str(key))
    assert result.returncode == 0, result.stderr
    return key


@pytest.fixture(scope="session")
def signed_package(digits_home: Path, entry_dir: Path, competition_dir: Path,
                   signing_key: Path) -> Path:
    from d500.competition.export import build
    return build(entry_dir, competition_dir / "digits-packager-signed.tar.gz",
                 digits_home / "ledger.sqlite", sign_key=signing_key)


@pytest.fixture
def ledger_copy(digits_home: Path, tmp_path: Path) -> Path:
    """A copy of the trained D500_HOME (ledger, MLLOGs) this test may change; its ledger file."""
    home = tmp_path / "home"
    shutil.copytree(digits_home, home, ignore=shutil.ignore_patterns("cache"))
    return home / "ledger.sqlite"
