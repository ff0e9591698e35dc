"""The entry's code trains apart from the judge (d500.training.worker): an optimizer that walks
the stack and the heap for held-out data finds none, one that patches the clock on import does
not change the recorded times, the judge never imports the entry's file; and the supervisor's
clock rules (validation on the clock, a target met after the budget is a miss) hold."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from d500.ledger import Ledger
from d500.training import submission, trainer, workloads
from d500.training.data import dataset
from d500.training.data.splits import split
from tests.helpers import ME, on_host

from . import entries
from .entries import MLP, ROOT, SGD

REAL_PERF_COUNTER, REAL_TIME = time.perf_counter, time.time

# Looks, at every update, through every frame of the stack and every object the garbage
# collector tracks (and the arrays inside them) for images of the digits (64 pixels each, in any
# shape); writes what it found to $D500_SNOOP. Images are hashed as float32 bytes.
SNOOP = '''
import gc, hashlib, inspect, json, os
import numpy as np
from d500.training.optimizers import Optimizer


def _rows(array, seen):
    if not isinstance(array, np.ndarray) or array.ndim < 2 or not len(array) \
            or array[0].size != 64:
        return
    for row in np.ascontiguousarray(array, dtype=np.float32).reshape(len(array), 64):
        seen.add(hashlib.sha256(row.tobytes()).hexdigest())


def _walk(value, seen, depth=3):
    """Arrays in `value`, its attributes and its items, `depth` levels down."""
    _rows(value, seen)
    if depth == 0 or isinstance(value, (str, bytes, np.ndarray)):
        return
    try:
        inner = list(vars(value).values()) if hasattr(value, "__dict__") else []
        if isinstance(value, dict):
            inner += list(value.values())
        elif isinstance(value, (list, tuple)):
            inner += list(value)
    except Exception:
        return
    for item in inner[:10000]:
        _walk(item, seen, depth - 1)


class Snoop(Optimizer):
    name = "snoop"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) in (1, 30):
            seen = set()
            for frame in inspect.stack():
                for value in list(frame.frame.f_locals.values()):
                    _walk(value, seen)
            for obj in gc.get_objects():  # (bare arrays are not tracked: their holders are)
                _walk(obj, seen, 1)
            with open(os.environ["D500_SNOOP"], "a") as out:
                out.write(json.dumps(sorted(seen)) + "\\n")
        ops.add_(params, grads, -lr)
'''

# Reads the memory of the processes around it through /proc (what a debugger does: the held-out
# data and the clock of a judge it could reach): its ancestors, and the children its process
# started with multiprocessing's spawn (level 3's rank 0 spawns its judge); appends to
# $D500_PEEK one JSON line {pid: [relation, what happened]} per look.
PEEK = """
import json as _json, os as _os


def _peek(pid):
    try:
        with open(f"/proc/{pid}/maps") as maps:
            start = next(int(line.split("-")[0], 16) for line in maps if " r" in line)
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(start)
            return "read" if len(mem.read(64)) == 64 else "empty"
    except (OSError, StopIteration, ValueError) as err:
        return type(err).__name__


def _below(pid):
    out = []
    for tid in _os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _spawned():  # (a level-3 rank's judges are its helper's children: d500.distributed.cover)
    out, todo = [], _below("self")
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            todo += _below(pid)
        except OSError:
            pass
    found = []
    for c in out:
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    found.append(c)
        except OSError:
            pass
    return found


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _ancestors():  # as the host sees them: a kept process's own getppid() may be 1 or 0
    pid, out = _parent("self"), []
    while pid > 1:
        out.append(pid)
        pid = _parent(pid)
    return out


def _look():
    seen = {a: ["ancestor", _peek(a)] for a in _ancestors()}
    seen.update({c: ["child", _peek(c)] for c in _spawned()})
    with open(_os.environ["D500_PEEK"], "a") as out:
        out.write(_json.dumps({"self": int(_os.readlink("/proc/self")), **seen}) + "\\n")
"""

# The control: a process that holds the splits as the judge's process used to, searched alike.
CONTROL = SNOOP + '''

def supervise():
    from d500.training import workloads
    from d500.training.data import dataset
    from d500.training.data.splits import split
    from d500.backends.reference import optimizer_ops as ops
    wl = workloads.load(os.environ["D500_WORKLOAD"])
    parts = split(dataset.load("digits"), wl.split_spec())
    p = [np.zeros(3, np.float32)]
    Snoop(lr=0.1).update(ops, p, p, {}, 0.1, 1)
    return parts


supervise()
'''

# On import, slows the clocks a process times itself with to half speed; every update sleeps
# 10 ms on the real clock, so the run's real training time is known from below.
CLOCK = '''
import time
from d500.training.optimizers import Optimizer

_perf, _wall, _sleep = time.perf_counter, time.time, time.sleep
_p0, _w0 = _perf(), _wall()
time.perf_counter = lambda: _p0 + (_perf() - _p0) / 2
time.time = lambda: _w0 + (_wall() - _w0) / 2


class Slow(Optimizer):
    name = "slow"

    def update(self, ops, params, grads, state, lr, t):
        _sleep(0.01)
        ops.add_(params, grads, -lr)
'''


def _hashes(x: np.ndarray) -> set[str]:
    return {hashlib.sha256(np.ascontiguousarray(r, dtype=np.float32).tobytes()).hexdigest()
            for r in x.reshape(len(x), -1)}


def test_an_optimizer_searching_the_stack_and_heap_finds_no_held_out_data(home, tmp_path,
                                                                          monkeypatch):
    entry = entries.entry(tmp_path, SNOOP, "Snoop")
    found = tmp_path / "found.jsonl"
    monkeypatch.setenv("D500_SNOOP", str(found))
    result = entries.run(entry)
    assert result.status in ("succeeded", "missed"), result.error
    parts = split(dataset.load("digits"), workloads.load(MLP).split_spec())
    train_rows = _hashes(parts.train.x)
    held_out = (_hashes(parts.validation.x) | _hashes(parts.test.x)) - train_rows
    looks = [set(json.loads(line)) for line in found.read_text().splitlines()]
    assert len(looks) == 3  # the search ran three times: in the warm-up's step of a copy on
    assert looks[0] & (train_rows | held_out) == set()  # zeros (before the clock: no data yet)
    for seen in looks[1:]:  # and at steps 1 and 30 of the run
        assert len(seen & train_rows) >= len(train_rows) * 0.9  # it does find what it holds
        assert seen & held_out == set()  # and nothing of the validation or test split
    # the control: the same search in a process holding the splits finds every held-out image
    # (a small process of its own: walking the test process's whole heap is not safe)
    found.unlink()
    control = subprocess.run([sys.executable, "-c", CONTROL], text=True, capture_output=True,
                             env={**os.environ, "D500_SNOOP": str(found),
                                  "D500_WORKLOAD": str(MLP)}, timeout=300)
    assert control.returncode == 0, control.stderr
    assert set(json.loads(found.read_text())) >= held_out


def _peeked(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_optimizer_cannot_read_the_judges_memory(home, tmp_path, monkeypatch):
    """The judge is shielded (undumpable) and the worker confined (no capabilities, even as
    root), so /proc/JUDGE/mem is closed to it (d500.children.shield, confine)."""
    code = PEEK + '''
from d500.training.optimizers import Optimizer


class Peek(Optimizer):
    name = "peek"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1:
            _look()
        ops.add_(params, grads, -lr)
'''
    entry = entries.entry(tmp_path, code, "Peek")
    found = tmp_path / "peek.jsonl"
    monkeypatch.setenv("D500_PEEK", str(found))
    result = entries.run(entry)
    assert result.status in ("succeeded", "missed"), result.error
    looks = _peeked(found)
    assert len(looks) == 2  # the warm-up's step before the clock, and step 1 of the run
    for look in looks:  # the judge (this process) started the worker (or its forkserver):
        # refused, or not even seen (the worker's PID namespace has a /proc of its own)
        assert look.get(str(os.getpid()), ["ancestor", "PermissionError"]) == [
            "ancestor", "PermissionError"], look
        assert not [k for k, v in look.items() if k != "self" and v[1] == "read"], look
    # the control: the same look from a child this process starts without confining it reads
    # the judge's memory (root: with CAP_SYS_PTRACE, which a shield does not stop)
    if os.geteuid() == 0:
        found.unlink()
        control = subprocess.run([sys.executable, "-c", PEEK + "\n_look()"], text=True,
                                 capture_output=True, env={**os.environ, "D500_PEEK": str(found)},
                                 timeout=60)
        assert control.returncode == 0, control.stderr
        assert _peeked(found)[0][str(os.getpid())] == ["ancestor", "read"]


def test_nothing_the_entry_starts_outlives_its_run(home, tmp_path, monkeypatch):
    """An optimizer that leaves a process behind (a double fork, as a daemon does) to edit the
    ledger later or spin on the cores: the worker's keeper kills it when the worker ends
    (d500.children.keep)."""
    code = '''
import os, time
from d500.training.optimizers import Optimizer


class Leave(Optimizer):
    name = "leave"

    def update(self, ops, params, grads, state, lr, t):
        if int(t) == 1 and os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(os.environ["D500_LEFT"], "a") as out:
                    out.write(@ME@ + "\\n")
                time.sleep(600)
            os._exit(0)
        ops.add_(params, grads, -lr)
'''.replace("@ME@", ME)
    entry = entries.entry(tmp_path, code, "Leave")
    left = tmp_path / "left.txt"
    monkeypatch.setenv("D500_LEFT", str(left))
    result = entries.run(entry)
    assert result.status in ("succeeded", "missed"), result.error
    named = left.read_text().splitlines()
    assert len(named) == 2  # the warm-up's step (before the clock) and step 1 of the run
    pids = [on_host(n) for n in named]  # (None: ended)
    try:
        assert pids == [None, None], f"process(es) {pids} outlived the run"
    finally:
        for pid in filter(None, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _entry_modules() -> set[str]:
    """The entry files imported into this process (d500's loader names them d500_submission_*);
    a test compares them before and after, since other tests in this process load theirs here."""
    return {m for m in sys.modules if m.startswith("d500_submission_")}


def test_an_optimizer_patching_the_clock_on_import_does_not_change_the_recorded_times(
        home, tmp_path):
    before = _entry_modules()  # other tests' in-process entries (tests/training/test_optimizers)
    entry = entries.entry(tmp_path, CLOCK, "Slow")
    ledger = Ledger()
    result = entries.run(entry, epochs=2, ledger=ledger)
    assert time.perf_counter is REAL_PERF_COUNTER and time.time is REAL_TIME
    assert _entry_modules() == before  # never imported here
    figures = ledger.get(result.run_id)["figures"]
    steps = 2 * (1197 // 32)  # two epochs of batch 32, drop_last
    assert figures["train_time"] >= steps * 0.01  # at half speed it would read half of that
    assert ledger.verify() == []


def test_validation_is_on_the_clock(home, monkeypatch):
    """A slow validation is inside the time to accuracy (a clock paused over it would not be)."""
    evaluated = trainer.accuracy

    def slow(predict, x, y):  # validation and test alike (test accuracy is measured after the
        time.sleep(0.2)  # run, in no figure: d500.training.heldout)
        return evaluated(predict, x, y)

    monkeypatch.setitem(trainer.QUALITY, "accuracy", slow)  # the workload's measure, by name
    wl = workloads.load(MLP)
    entry = submission.load(SGD)
    ledger = Ledger()
    result = trainer.train(wl, entry.recipe, "torch", 0, ledger=ledger, submission="sgd")
    assert result.status == "succeeded", result.error
    f = ledger.get(result.run_id)["figures"]
    assert f["eval_time"] >= 0.2 * f["epochs"]
    assert f["time_to_accuracy"] >= f["train_time"] + f["eval_time"] + f["data_time"]


def test_a_target_met_after_the_budget_is_a_miss(home, monkeypatch):
    """A controlled clock jumps 1,000 s once the first chunk trained: the target, met at the
    first evaluation, is met after the 120 s budget."""

    class Jump(trainer.Clock):
        def now(self) -> float:
            return super().now() + (1000.0 if self.train > 0 else 0.0)

    monkeypatch.setattr(trainer, "Clock", Jump)
    wl = workloads.load(MLP)
    wl.target = 0.5  # met at the first evaluation
    entry = submission.load(SGD)
    ledger = Ledger()
    result = trainer.train(wl, entry.recipe, "torch", 0, ledger=ledger, submission="sgd")
    assert result.status == "missed"
    f = ledger.get(result.run_id)["figures"]
    assert f["time_to_accuracy"] == math.inf and f["val_accuracy"] >= 0.5
    evaluations = ledger.evaluations(result.run_id)
    assert len(evaluations) == 1 and evaluations[0]["wall_time"] > wl.max_seconds


class _ThreadProcess(threading.Thread):
    """A Process stand-in that runs its target in a thread of this process, so that the test's
    controlled clock (a monkeypatch here) reaches level 3's judge."""

    exitcode = 0

    def __init__(self, target, args, name, daemon):
        super().__init__(target=target, args=args, name=name, daemon=daemon)

    def kill(self):
        pass


class _Kept:
    """A connection end whose close() waits for the end of the thread that reads it (the parent
    closes its copy of the child's end once the child started; here they are the same)."""

    def __init__(self, conn):
        self._conn = conn

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _pipe():
    import multiprocessing
    parent, child = multiprocessing.Pipe()
    return parent, _Kept(child)


def test_a_level3_target_met_after_the_budget_is_a_miss(home, monkeypatch):
    """Level 3's judge (one rank, no MPI) runs level 2's loop: the same controlled clock, the
    same rule. The judge runs in a thread here so that the clock reaches it."""
    import types

    from d500 import threads
    from d500.distributed import judge, spec
    from d500.distributed import workloads as level3
    from d500.distributed.comm import Communicator
    from d500.distributed.trainer import Job
    from d500.distributed.trainer import train as train3

    class Jump(trainer.Clock):
        def now(self) -> float:
            return super().now() + (1000.0 if self.train > 0 else 0.0)

    monkeypatch.setattr(trainer, "Clock", Jump)
    # no thread count for the judge to set in this process (a TensorFlow another test ran here
    # keeps its own, and cannot change)
    monkeypatch.setattr(threads, "recorded", lambda: None)
    threaded = types.SimpleNamespace(Pipe=_pipe, Process=_ThreadProcess)
    monkeypatch.setattr(judge.multiprocessing, "get_context", lambda method: threaded)
    wl = level3.load(ROOT / "levels" / "3-distributed" / "digits-mlp.yaml")
    wl.target = 0.5
    entry = submission.load(ROOT / "submissions" / "sync")
    ledger = Ledger()
    job = Job(Communicator(None), wl, entry, spec.parse(entry.distributed, entry.path), "torch",
              ledger=ledger)
    result = train3(job, 0)
    assert result.status == "missed", result.error
    f = ledger.get(result.run_id)["figures"]
    assert f["time_to_accuracy"] == math.inf and f["val_accuracy"] >= 0.5


def test_the_judge_validates_an_entrys_optimizer_without_importing_it(tmp_path):
    """submission.load checks the optimizer file's hyperparameters in a child process: the file
    ran there (it leaves a mark), never here; a bad value is one ConfigError naming the
    submission file and the hyperparameter."""
    from d500.errors import ConfigError
    mark = tmp_path / "imported-in"
    code = ("import os\nfrom d500.training.optimizers.sgd import Momentum\n"
            f"open({str(mark)!r}, 'a').write(str(os.getpid()) + '\\n')\n\n\n"
            "class Marked(Momentum):\n    name = 'marked'\n")
    before = _entry_modules()
    entry = entries.entry(tmp_path, code, "Marked")
    pids = mark.read_text().split()
    assert pids and str(os.getpid()) not in pids
    assert _entry_modules() == before
    assert entry.recipe.optimizer_name == "marked" and entry.recipe.hp()["lr"] == 0.1
    data = yaml.safe_load((tmp_path / "entry" / "submission.yaml").read_text())
    data["hyperparameters"] = {"lr": -1.0}
    (tmp_path / "entry" / "submission.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"submission.yaml: .*hyperparameter 'lr' must be a "
                                          r"finite number > 0, got -1.0"):
        submission.load(tmp_path / "entry")


def test_the_judge_evaluates_its_own_copy_of_what_the_worker_handed_over():
    """Judge.load copies a hand-over into the judge's own parameters (NumPy views of its
    tensors, where the backend has them): it then predicts what the worker's model predicts,
    changing the handed-over arrays afterwards changes nothing, and values that are not numbers
    or a wrong shape are one D500Error naming the parameter."""
    from d500 import backends
    from d500.errors import D500Error
    from d500.training.optimizers import make
    from d500.training.trainable import trainable_model
    model = trainable_model(workloads.load(MLP), 3)
    cls = backends.get("torch")
    ours = cls.prepare(model).trainer(make("sgd", lr=0.5), loss="loss")
    x = np.random.default_rng(0).standard_normal((40, 1, 8, 8)).astype(np.float32)
    y = np.arange(40) % 10
    for _ in range(3):  # parameters that differ from the model's initial ones
        ours.step({"input": x, "labels": y}, 0.5)
    judge = trainer.Judge(cls, model)
    assert judge.views is not None  # torch on the CPU: the fast path is the one tested
    state = {**ours.parameters(), **ours.buffers()}
    assert not np.allclose(judge.predict({"input": x}), ours.predict({"input": x}))
    judge.load(state)
    expected = ours.predict({"input": x})
    np.testing.assert_array_equal(judge.predict({"input": x}), expected)
    for value in state.values():
        value[...] = 0.0
    np.testing.assert_array_equal(judge.predict({"input": x}), expected)
    name = ours.parameter_names[0]
    bad = dict(state, **{name: np.full(state[name].shape, "w")})
    with pytest.raises(D500Error, match=rf"handed over '{name}' as <U1, not as numbers"):
        judge.load(bad)
    with pytest.raises(D500Error, match=rf"handed over '{name}' with shape \(1,\)"):
        judge.load(dict(state, **{name: np.zeros(1, np.float32)}))
