"""A rank's seccomp filter: no signal from the entry's code reaches the d500 processes that keep
this host's ranks (each rank's waiter and keeper, d500.children.keep) nor the launcher's proxy
that started them. A rank runs as the same user as they do and in no PID namespace of its own
(its MPI peers read its memory by pid), so the kernel would let it stop its keeper and kill its
waiter: its processes then left the job's tree, where nothing stops them while the judge's
clock is paused, counts their CPU as the job's or ends them with it (d500.distributed.jobtree).

    guard.install(world)    # every rank, collectively, after the judges started (they are
                            # not filtered: a judge stops the ranks) and before the entry's code

The filter (inherited by every thread and process the rank starts, and never lifted: the rank
has set no_new_privs, d500.children.confine) answers EPERM to kill() and rt_sigqueueinfo() of
those pids, of a process group (0, negative: a rank shares its keeper's) or of every process
(-1); to tgkill(), rt_tgsigqueueinfo() and prlimit64() (an RLIMIT_CPU of 0 is a SIGKILL) of
those pids, tkill() of any of their threads, F_SETOWN (a SIGIO sent on its behalf) to them or
to a group and F_SETOWN_EX, FIOSETOWN and SIOCSPGRP (their targets lie in memory a filter cannot
read), every pidfd_send_signal(), and any system call of another ABI (x86's 32-bit one, x32).
libseccomp (through pyseccomp) builds and loads it: rules by system call name, each int
argument compared on its low 32 bits (all the kernel reads of it).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any

from d500.provenance import cmdline_of, parent_of

F_SETOWN, F_SETOWN_EX = 8, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
LOW = 0xFFFFFFFF  # an int argument: its low word (the kernel drops the register's high one)
NEGATIVE = 0x80000000  # an int argument's low word with this bit: a group, or -1
_installed = False


def library() -> Any:
    """pyseccomp (libseccomp's interface), or None where it or libseccomp is missing."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError):  # RuntimeError: no libseccomp found
        return None
    return pyseccomp


def install(world: Any) -> bool:
    """Every rank of `world` (collective): gather each rank's keeper, waiter and proxy, then
    filter this rank's signals to those on its host. False where no filter was installed (not
    Linux, no libseccomp or an architecture it does not know, a kernel without seccomp, or a
    rank not kept)."""
    global _installed
    mine = _kept_by()
    every = world.allgather((socket.gethostname(), mine))
    if _installed or mine is None:
        return False
    here = [kept for host, kept in every if host == socket.gethostname() and kept]
    pids = sorted({p for kept in here for p in kept})
    threads = sorted({t for p in pids for t in _threads(p)} | set(pids))
    _installed = load(pids, threads)
    if not _installed and os.environ.get("D500_DEBUG") == "1":
        print("d500: debug: no seccomp filter loaded on this rank: its processes could signal "
              "its keeper and waiter", file=sys.stderr)
    return _installed


def _kept_by() -> tuple[int, ...] | None:
    """(keeper, waiter, proxy) of this rank: the two d500 processes above it and the one that
    started them (d500.children.keep splits twice, each a fork with this command line), or
    None where this process was not split so."""
    keeper = os.getppid()
    waiter = parent_of(keeper)
    proxy = parent_of(waiter) if waiter else None
    line = cmdline_of(os.getpid())
    if (not waiter or not proxy or line is None
            or {cmdline_of(keeper), cmdline_of(waiter)} != {line}):
        return None
    return keeper, waiter, proxy


def program(pids: list[int], threads: list[int]) -> Any:
    """The filter (a pyseccomp.SyscallFilter, not loaded) for this machine's ABI: every other
    ABI's system calls (x86's 32-bit one, x32) refused by libseccomp's bad-architecture action;
    OSError where libseccomp cannot build it."""
    sc = library()
    if sc is None:
        raise OSError(errno.ENOSYS, "no libseccomp")
    deny = sc.ERRNO(errno.EPERM)
    out = sc.SyscallFilter(defaction=sc.ALLOW)
    out.set_attr(sc.Attr.ACT_BADARCH, deny)
    out.set_attr(sc.Attr.CTL_TSYNC, 1)  # every thread of this process (MPI's included)

    def low(i: int, value: int) -> Any:
        return sc.Arg(i, sc.MASKED_EQ, LOW, value)

    negative = sc.Arg(0, sc.MASKED_EQ, NEGATIVE, NEGATIVE)  # -1, -pgid
    for name in ("kill", "rt_sigqueueinfo"):
        out.add_rule(deny, name, low(0, 0))  # this process's group
        out.add_rule(deny, name, negative)
    for name in ("kill", "rt_sigqueueinfo", "tgkill", "rt_tgsigqueueinfo", "prlimit64"):
        for pid in pids:
            out.add_rule(deny, name, low(0, pid))
    for thread in threads:
        out.add_rule(deny, "tkill", low(0, thread))
    out.add_rule(deny, "pidfd_send_signal")
    out.add_rule(deny, "fcntl", low(1, F_SETOWN_EX))
    out.add_rule(deny, "fcntl", low(1, F_SETOWN), sc.Arg(2, sc.MASKED_EQ, NEGATIVE, NEGATIVE))
    for pid in pids:
        out.add_rule(deny, "fcntl", low(1, F_SETOWN), low(2, pid))
    for request in (FIOSETOWN, SIOCSPGRP):
        out.add_rule(deny, "ioctl", low(1, request))
    return out


def load(pids: list[int], threads: list[int]) -> bool:
    """Build the filter and load it (seccomp(SECCOMP_SET_MODE_FILTER, TSYNC) through libseccomp):
    whether the kernel took it."""
    try:
        program(pids, threads).load()
    except OSError:
        return False
    return True


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []
