"""Environments on the leaderboard: the hardware identity that decides which times may be ranked
against each other, which metrics depend on the machine, and the legend (E1, E2, ...) that
prints each distinct environment's provenance once for the rows to refer to.

    machine(env)            # hardware identity: CPU model, logical cores, memory, GPUs, arch
    machine_dependent(m)    # its definition says so: only comparable on the same hardware
    apart(boards)           # {machine: hardware} the levels' views keep apart, or {}
    legend = Legend.of(boards); legend.labels(entry) -> ["E1"]; legend.items -> [Item]
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from d500.metrics import Metric
from d500.say import shown

if TYPE_CHECKING:
    from d500.leaderboard.ranking import Board, Entry

UNKNOWN = "unknown machine (no provenance recorded)"


def machine_dependent(metric: Metric) -> bool:
    """Whether a metric's values depend on the hardware that measured them, as its definition
    says (MACHINE_DEPENDENT in metrics/: times, rates and ratios of times such as speedup,
    scaling_efficiency, comm_share, peak_fraction). Accuracies, errors, byte counts and steps or
    epochs to the target are comparable on any machine."""
    return metric.machine_dependent


def hardware(env: dict[str, Any] | None) -> dict[str, Any]:
    """The parts of a provenance that identify the hardware: CPU model, logical cores, memory
    (to the GiB: MemTotal moves by megabytes between kernels), GPUs and architecture. Software
    versions, thread counts, the measured peak and the host name are left out."""
    if not env:
        return {}
    cpu = env.get("cpu") or {}
    memory = env.get("memory_bytes")
    return {"cpu": cpu.get("model"), "logical_cores": cpu.get("logical_cores"),
            "memory_gib": None if not memory else round(memory / 2**30),
            "gpus": sorted(f"{g.get('name', '?')} {g.get('memory', '')}".strip()
                           for g in env.get("gpus") or []),
            "machine": env.get("machine")}


def machine(env: dict[str, Any] | None) -> str:
    """A short stable key of the hardware identity ("" when no provenance was recorded)."""
    ident = hardware(env)
    if not ident:
        return ""
    raw = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def hardware_text(env: dict[str, Any] | None) -> str:
    """The hardware in words: "Intel Xeon ×2 cores, 8 GiB, x86_64, no GPU"."""
    ident = hardware(env)
    if not ident:
        return UNKNOWN
    cores = ident["logical_cores"]
    words = [f"{ident['cpu'] or '?'} ×{cores if cores is not None else '?'} logical cores"]
    words.append(f"{ident['memory_gib']} GiB" if ident["memory_gib"] is not None
                 else "memory unknown")
    if ident["machine"]:
        words.append(ident["machine"])
    words.append(", ".join(ident["gpus"]) if ident["gpus"] else "no GPU")
    return shown(", ".join(words))  # (a CPU model holding a terminal's escapes, its MLLOG
    # platform line alike and re-sealed, passed d500 check: the legend printed them as sent)


def describe(env: dict[str, Any] | None) -> str:
    """The full provenance in one line for the legend: hardware; OS and Python; every library
    version recorded; MPI library; threads; the measured peak; the d500 commit."""
    if not env:
        return UNKNOWN
    parts = [hardware_text(env)]
    system = env.get("os")
    python = env.get("python")
    parts.append(", ".join(p for p in (system, f"Python {python}" if python else "") if p)
                 or "OS unknown")
    pk = env.get("packages") or {}
    libs = ", ".join(f"{k} {v}" for k, v in pk.items() if v)
    if libs:
        parts.append(libs)
    if env.get("mpi_library"):
        parts.append(str(env["mpi_library"]))
    count = (env.get("threads") or {}).get("count")
    parts.append(f"{count} thread{'s' if count != 1 else ''}" if count
                 else "threads: each framework's default")
    if env.get("peak_flops"):
        loaded = (env.get("peak_flops_conditions") or {}).get("loaded")
        parts.append(f"peak {env['peak_flops'] / 1e9:.0f} GFLOP/s"
                     + (" (measured under load)" if loaded else ""))
    git = env.get("git") or {}
    if git.get("commit"):
        parts.append(f"d500 git {git['commit'][:10]}" + ("+dirty" if git.get("dirty") else ""))
    return shown(" · ".join(parts))


@dataclass
class Item:
    """One legend line: its label (E1, ...), the machine key, the hardware and the provenance."""

    label: str
    machine: str
    hardware: str
    text: str


@dataclass
class Legend:
    """Each distinct environment of a leaderboard once, labelled E1, E2, ... in the order the
    ledger first recorded them (environments that read the same are one), so a label does not
    move when the ranking does."""

    items: list[Item] = field(default_factory=list)
    _by_text: dict[str, Item] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, boards: Iterable[Board]) -> Legend:
        found: list[tuple[float, int, dict[str, Any]]] = []
        for board in boards:
            for entry in board.entries:
                ids = entry.environment_ids
                for i, env in enumerate(entry.environments):
                    order = ids[i] if len(ids) == len(entry.environments) else math.inf
                    found.append((order, len(found), env))
        legend = cls()
        for _, _, env in sorted(found, key=lambda f: f[:2]):
            legend.add(env)
        return legend

    def add(self, env: dict[str, Any] | None) -> Item:
        text = describe(env)
        item = self._by_text.get(text)
        if item is None:
            item = Item(f"E{len(self.items) + 1}", machine(env), hardware_text(env), text)
            self.items.append(item)
            self._by_text[text] = item
        return item

    def labels(self, entry: Entry) -> list[str]:
        """The labels of the environments an entry's runs ran in (added when new)."""
        return list(dict.fromkeys(self.add(env).label for env in entry.environments))

    def of_machine(self, key: str) -> list[str]:
        """The labels of the environments on one machine."""
        return [i.label for i in self.items if i.machine == key]

    @property
    def machines(self) -> list[str]:
        return list(dict.fromkeys(i.machine for i in self.items))

    def __bool__(self) -> bool:
        return bool(self.items)


def apart(boards: Sequence[Board]) -> dict[str, str]:
    """The machines whose time figures the levels' views must keep apart, each with its hardware
    in words (in the legend's order): every machine of the boards' entries when they span
    several and the organiser did not ask to rank across machines; {} otherwise (one machine, or
    --across-machines: the views pool every run, as the boards rank them together)."""
    keys = dict.fromkeys(e.machine for b in boards for e in b.entries)
    if len(keys) < 2 or any(b.across_machines for b in boards):
        return {}
    words = {}
    for item in Legend.of(boards).items:
        words.setdefault(item.machine, item.hardware)
    ordered = [k for k in words if k in keys] + [k for k in keys if k not in words]
    return {k: words.get(k, UNKNOWN) for k in ordered}


def machine_columns(boards: Sequence[Board]) -> tuple[list[str], list[str]]:
    """(machine-dependent, comparable) metric names shown on these boards, each once."""
    shown = [m for b in boards for m in b.metrics]
    dependent = dict.fromkeys(m.name for m in shown if machine_dependent(m))
    comparable = dict.fromkeys(m.name for m in shown if not machine_dependent(m))
    return list(dependent), list(comparable)
