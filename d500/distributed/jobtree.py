"""The job's processes on rank 0's host, as level 3's judge finds them before any rank runs the
entry's code: under the launcher's proxy, each local rank's waiter (the process the proxy
started), its keeper and the rank itself (d500.children.keep). The judge stops every rank's
processes while its clock is paused (`hold`), and checks that each keeper and waiter still
stands, running, between its rank and the job, its oom_score_adj not raised (`broken`): a rank
of the same user may signal them (no PID namespace: MPI reads its peers by pid), and one that
stopped its keeper and killed its waiter took its processes out of the job's tree, where no hold
stops them, no CPU reading counts them and nothing ends them with the job.

    tree = JobTree.found(job_root())    # in the judge, before it says it is shielded
    tree.broken()                       # "" while every keeper and waiter stands
    held = tree.hold(); ...; children.release(held)
    tree.end_escaped()                  # after the run is recorded failed: what left the tree
    tree.cpu_seconds()                  # the ranks' CPU here, for d500.training.cpu.Meter
    tree.rank_cpu_seconds(tree.ranks[0])  # one rank's
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from d500 import children
from d500.distributed.launch import RANK_VARIABLES
from d500.errors import D500Error


class Escaped(D500Error):
    """A rank's keeper or waiter was stopped or killed: the run is recorded failed."""


@dataclass(frozen=True)
class Proc:
    """A process as first seen: its pid and start time (a reused pid is another process)."""

    pid: int
    start: int

    def state(self) -> tuple[str, int] | None:
        """(state letter, parent pid) while this process lives; None once it is gone (a
        zombie too)."""
        found = _stat(self.pid)
        if found is None or found[2] != self.start or found[0] in "ZX":
            return None
        return found[0], found[1]


@dataclass(frozen=True)
class Local:
    """One rank on this host: the waiter hydra's proxy started, its keeper, the rank."""

    rank: str
    waiter: Proc
    keeper: Proc
    kept: Proc


@dataclass
class JobTree:
    root: Proc
    ranks: list[Local]
    # each waiter's and keeper's oom_score_adj as found: a rank run as root without
    # capabilities owns their /proc files (undumpable: root's) and may raise it, making its
    # keeper the OOM killer's first choice (tests/distributed/test_keeper_oom_mpi.py)
    oom: dict[int, int | None] = field(default_factory=dict)

    @classmethod
    def found(cls, root: int) -> JobTree | None:
        """The tree under `root` (the proxy, d500.distributed.judge.job_root), read from /proc;
        None where it is not one of waiters, keepers and ranks (not Linux, or no launcher)."""
        top = _proc(root)
        if top is None:
            return None
        ranks = []
        for waiter in children.of(root):
            keepers = children.of(waiter)
            kept = children.of(keepers[0]) if len(keepers) == 1 else []
            procs = [_proc(p) for p in (waiter, *keepers, *kept)]
            if len(kept) != 1 or None in procs:
                return None
            ranks.append(Local(_rank(kept[0]), *procs))
        oom = {p.pid: _oom(p.pid) for one in ranks for p in (one.waiter, one.keeper)}
        return cls(top, ranks, oom) if ranks else None

    def broken(self) -> str:
        """Why some rank's keeper or waiter no longer stands between it and the job (one line),
        or "": each alive, not stopped, the parent of the next, the waiter the root's child."""
        if self.root.state() is None:
            return (f"the launcher's process that started this host's ranks (pid "
                    f"{self.root.pid}) is gone: {_WHY}")
        return next((why for one in self.ranks if (why := self._broken(one))), "")

    def lost_rank(self) -> bool:
        """Whether some rank here died (its process gone, as first seen): its keeper and waiter
        then end after it, as they do, and a tree broken so is a rank lost, whose run may resume
        from a checkpoint sealed before (d500.training.resume; a break is found before a hold,
        so no checkpoint follows one)."""
        return any(one.kept.state() is None for one in self.ranks)

    def _broken(self, one: Local) -> str:
        for what, proc, parent in (("waiter", one.waiter, self.root),
                                   ("keeper", one.keeper, one.waiter)):
            state = proc.state()
            if state is None:
                return f"rank {one.rank}'s {what} (pid {proc.pid}) was killed: {_WHY}"
            if state[0] in "Tt":
                return f"rank {one.rank}'s {what} (pid {proc.pid}) is stopped: {_WHY}"
            if state[1] != parent.pid:
                return f"rank {one.rank}'s {what} (pid {proc.pid}) left the job's tree: {_WHY}"
            was, now = self.oom.get(proc.pid), _oom(proc.pid)
            if was is not None and now is not None and now > was:
                return (f"rank {one.rank}'s {what} (pid {proc.pid}) had its oom_score_adj "
                        f"raised from {was} to {now}: a rank's process made it the OOM "
                        f"killer's first choice, which would end the d500 process that ends "
                        f"the rank's with the job (d500.children.keep)")
        state = one.kept.state()
        if state is not None and state[1] != one.keeper.pid:
            return f"rank {one.rank} (pid {one.kept.pid}) is no longer its keeper's child: {_WHY}"
        return ""

    def hold(self, deadline: float = 5.0) -> list[int]:
        """Stop (d500.children.hold) every process under the root but this judge, its own, the
        waiters and the keepers (d500's, idle): every local rank's, all they started, the
        orphans their keepers adopted; raises Escaped first where the tree is `broken`, and
        children.Unheld where one has not stopped within `deadline` s (a loaded machine's
        threads may wait that long for a CPU to stop on)."""
        why = self.broken()
        if why:
            raise Escaped(why)
        me = os.getpid()
        spare = {me}
        if me in children._descendants(self.root.pid):  # (rank 0's child): its own too
            spare |= set(children._descendants(me))
        spare |= {p.pid for one in self.ranks for p in (one.waiter, one.keeper)}
        return children.hold(self.root.pid, deadline, spare=spare)

    def cpu_seconds(self) -> tuple[float, dict[int, tuple[float, ...]]]:
        """What every local rank's keeper and all behind it used (the rank, what it started,
        the orphans the keeper adopted: d500.children.cpu_seconds), this judge and all it
        started left out (rank 0's child), the keepers' own idle waits in: the CPU seconds, and
        each live thread's run and wait for a CPU (d500.training.cpu.Meter's reading)."""
        total, live = 0.0, {}
        for one in self.ranks:
            used, threads = self.rank_cpu_seconds(one)
            total, live = total + used, {**live, **threads}
        return total, live

    def rank_cpu_seconds(self, one: Local) -> tuple[float, dict[int, tuple[float, ...]]]:
        """`cpu_seconds` of one local rank: its keeper and all behind it (none once its keeper
        is gone: hold and the end say so)."""
        if one.keeper.state() is None:
            return 0.0, {}
        return children.cpu_seconds(one.keeper.pid, spare=(os.getpid(),))

    def end_escaped(self) -> None:
        """SIGKILL what a broken tree let out, once the run is recorded failed: each broken
        rank's waiter, keeper and rank (as first seen) and all below them (rank 0's judge dies
        with rank 0); the other ranks end as a failed job does."""
        if self.root.state() is None:
            broken = self.ranks
        else:
            broken = [one for one in self.ranks if self._broken(one)]
        me, found = os.getpid(), []
        for one in broken:
            for proc in (one.waiter, one.keeper, one.kept):
                if proc.state() is not None:
                    found += [proc.pid, *children._descendants(proc.pid)]
        for pid in dict.fromkeys(found):
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


_WHY = ("a rank's process stopped or killed the d500 processes that stop its processes while "
        "the judge's clock is paused and end them with the job (d500.children.keep)")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in ticks) of process `pid`, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _oom(pid: int) -> int | None:
    """Process `pid`'s oom_score_adj, or None."""
    try:
        with open(f"/proc/{pid}/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _proc(pid: int) -> Proc | None:
    found = _stat(pid)
    return None if found is None else Proc(pid, found[2])


def _rank(pid: int) -> str:
    """The rank its launcher gave process `pid` (its environment), or "?"."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return "?"
    for name in RANK_VARIABLES:
        if name.encode() in env:
            return env[name.encode()].decode(errors="replace")
    return "?"
