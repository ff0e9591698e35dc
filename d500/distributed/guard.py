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
read), every pidfd_send_signal(), and any system call of another ABI (x86's 32-bit one).
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
import sys
from typing import Any

from d500.provenance import cmdline_of, parent_of

# per architecture: AUDIT_ARCH, seccomp(2), and the system calls filtered
ARCHES = {
    "x86_64": (0xC000003E, 317, {"kill": 62, "tkill": 200, "tgkill": 234,
                                 "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
                                 "pidfd_send_signal": 424, "prlimit64": 302, "fcntl": 72,
                                 "ioctl": 16}),
    "aarch64": (0xC00000B7, 277, {"kill": 129, "tkill": 130, "tgkill": 131,
                                  "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                                  "pidfd_send_signal": 424, "prlimit64": 261, "fcntl": 25,
                                  "ioctl": 29}),
}
F_SETOWN, F_SETOWN_EX = 8, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
NEGATIVE = 0x80000000  # an int argument's low word at or above this: a group, or -1
X32 = 0x40000000  # x86_64's x32 ABI: system call numbers with this bit
_installed = False


def install(world: Any) -> bool:
    """Every rank of `world` (collective): gather each rank's keeper, waiter and proxy, then
    filter this rank's signals to those on its host. False where no filter was installed (not
    Linux, an architecture not in ARCHES, a kernel without seccomp, or a rank not kept)."""
    global _installed
    mine = _kept_by()
    every = world.allgather((socket.gethostname(), mine))
    if _installed or mine is None or platform.machine() not in ARCHES:
        return False
    here = [kept for host, kept in every if host == socket.gethostname() and kept]
    pids = sorted({p for kept in here for p in kept})
    threads = sorted({t for p in pids for t in _threads(p)} | set(pids))
    try:
        _installed = _load(program(pids, threads))
    except ValueError:
        pass
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


def program(pids: list[int], threads: list[int], machine: str | None = None) -> list[tuple]:
    """The filter, as (code, jt, jf, k) instructions (classic BPF over struct seccomp_data)."""
    arch, _, nr = ARCHES[machine or platform.machine()]
    out: list[tuple] = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, DENY),
                        (0x20, 0, 0, 0)]  # the ABI checked; the system call's number loaded
    if (machine or platform.machine()) == "x86_64":
        out += [(0x35, 0, 1, X32), (0x06, 0, 0, DENY)]

    def block(call: int, tests: list[tuple]) -> None:
        """If the call is `call`: `tests` (each jumping to DENY when it holds), else on."""
        body = tests + [(0x06, 0, 0, ALLOW), (0x06, 0, 0, DENY)]
        fixed = []
        for i, (code, jt, jf, k) in enumerate(body):  # jt/jf -1: to this block's DENY
            to_deny = len(body) - 1 - i - 1
            fixed.append((code, to_deny if jt == -1 else jt, to_deny if jf == -1 else jf, k))
        if len(fixed) > 255:  # (a jump's reach)
            raise ValueError(f"{len(pids)} pids, {len(threads)} threads: too many to filter")
        out.extend([(0x15, 0, len(fixed), call)] + fixed + [(0x20, 0, 0, 0)])

    def arg(i: int) -> tuple:
        return (0x20, 0, 0, 16 + 8 * i)  # args[i]'s low word (little-endian)

    def among(values: list[int]) -> list[tuple]:
        return [(0x15, -1, 0, v) for v in values]

    group = [(0x15, -1, 0, 0), (0x35, -1, 0, NEGATIVE)]  # 0, -1, -pgid
    for name in ("kill", "rt_sigqueueinfo"):
        block(nr[name], [arg(0), *group, *among(pids)])
    for name in ("tgkill", "rt_tgsigqueueinfo", "prlimit64"):
        block(nr[name], [arg(0), *among(pids)])
    block(nr["tkill"], [arg(0), *among(threads)])
    out += [(0x15, 0, 1, nr["pidfd_send_signal"]), (0x06, 0, 0, DENY)]
    owner = [(0x15, 1, 0, F_SETOWN), (0x06, 0, 0, ALLOW), arg(2), (0x35, -1, 0, NEGATIVE),
             *among(pids)]
    block(nr["fcntl"], [arg(1), (0x15, -1, 0, F_SETOWN_EX), *owner])
    block(nr["ioctl"], [arg(1), (0x15, -1, 0, FIOSETOWN), (0x15, -1, 0, SIOCSPGRP)])
    out.append((0x06, 0, 0, ALLOW))
    return out


def _load(instructions: list[tuple]) -> bool:
    """seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC): every thread of this
    process filtered (MPI's included); whether the kernel took it."""
    data = b"".join(struct.pack("HBBI", *i) for i in instructions)
    buffer = ctypes.create_string_buffer(data, len(data))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(instructions), ctypes.cast(buffer, ctypes.c_void_p))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = ARCHES[platform.machine()][1]
        return libc.syscall(call, 1, 1, ctypes.byref(prog)) == 0
    except (OSError, AttributeError):
        return False


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []

