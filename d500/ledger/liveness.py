"""Whether the process that wrote a ledger row still runs: identity across pid reuse and reboots.

A row is inserted with its writer's pid, host, boot id and process start time (clock ticks since
boot, from /proc); a `running` row whose writer is gone is shown, and later sealed, as
`interrupted`. Without /proc (not Linux) only the pid is checked.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a Linux process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], fields[19]


def process_identity() -> dict[str, Any]:
    """What identifies this process across pid reuse and reboots."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(),
            "proc_start": stat[1] if stat else None}


def process_alive(pid: int | None, host: str | None, boot: str | None,
                  proc_start: str | None) -> bool | None:
    """Whether the process that wrote a row still runs: True, False, or None (another host)."""
    if pid is None or host != socket.gethostname():
        return None
    if boot and boot_id() and boot != boot_id():
        return False  # the machine rebooted since
    if Path("/proc/self/stat").exists():
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return False
        return proc_start is None or stat[1] == proc_start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_writers(rows: list[Any]) -> list[int]:
    """The ids of the rows (id, pid, host, boot_id, proc_start) whose writer died on this host."""
    return [r[0] for r in rows if process_alive(*tuple(r)[1:5]) is False]
