"""d500 check's restarts step: resumed runs (d500.training.resume) listed with their segments,
and the ways a sender could use restarts to fool the reader flagged.

Flagged: a checkpoint that started more than one run (restarting from one checkpoint several
times and keeping the luckiest continuation), a resumed run whose checkpoint its parent never
sealed or whose parent is not in the package (a continuation of a run that is hidden), and a
resumed run whose clock starts before its parent was last seen (time of a segment left off):
before its last evaluation, or before the clock its parent sealed with the checkpoint (a start
below zero, from a parent that never evaluated, shortened every time of the log: digits-mlp's
0.278 s to accuracy passed as 0.028 s).
"""

from __future__ import annotations

import math
from typing import Any


def _sealed(run: Any) -> set[str]:
    """The checkpoint digests a run sealed: those it wrote and the one it started from."""
    found = {c.get("sha256") for c in run.details.get("checkpoints", [])}
    started = run.details.get("resumed") or {}
    return found | ({started["sha256"]} if "sha256" in started else set())


def number(value: Any) -> float | None:
    """A finite recorded number as a float (None: anything else)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _clocks(parent: Any, digest: Any) -> list[float | None]:
    """The run clock (s) at which `parent` sealed the checkpoint `digest`: as it wrote it, or,
    where it was itself resumed from that checkpoint, its own clock's start."""
    out = [number(c.get("clock")) for c in parent.details.get("checkpoints", [])
           if isinstance(c, dict) and c.get("sha256") == digest]
    started = parent.details.get("resumed") or {}
    if started.get("sha256") == digest:
        out.append(number(started.get("before")))
    return out


def problems(runs: list[Any]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the resumed runs among `runs` (a package's, by origin id)."""
    by_id = {r.origin_id: r for r in runs}
    resumed = [r for r in runs if r.details.get("resumed")]
    out: list[str] = []
    used: dict[str, list[int]] = {}
    for run in resumed:
        info = run.details["resumed"]
        used.setdefault(info.get("sha256", ""), []).append(run.origin_id)
        parent = by_id.get(info.get("from_run"))
        where = f"run {run.origin_id} (resumed from run {info.get('from_run')})"
        if parent is None:
            out.append(f"{where}: run {info.get('from_run')} is not in the package (a hidden "
                       f"segment)")
            continue
        if info.get("sha256") not in _sealed(parent):
            out.append(f"{where}: its checkpoint {info.get('checkpoint')} (sha256 "
                       f"{str(info.get('sha256'))[:12]}…) is not one run {parent.origin_id} "
                       f"sealed")
        seen = [e[2] for e in parent.evaluations if isinstance(e[2], (int, float))]
        before = number(info.get("before"))
        if before is None or before < 0:
            out.append(f"{where}: its clock starts at {info.get('before')!r} s, not a time of "
                       f"its parent's clock (which starts at 0 s)")
            continue
        if seen and before < max(seen):
            out.append(f"{where}: its clock starts at {before:.3f} s, before run "
                       f"{parent.origin_id}'s last evaluation at {max(seen):.3f} s (a segment's "
                       f"time left off)")
        clock = max((c for c in _clocks(parent, info.get("sha256")) if c is not None),
                    default=None)
        if clock is None or before < clock:
            at = "records no time" if clock is None else f"was written at {clock:.3f} s"
            out.append(f"{where}: its clock starts at {before:.3f} s, but the checkpoint it "
                       f"resumed {at} of run {parent.origin_id}'s clock (a segment's time left "
                       f"off)")
    for digest, ids in sorted(used.items()):
        if len(ids) > 1:
            out.append(f"checkpoint sha256 {digest[:12]}… was resumed by runs "
                       f"{', '.join(map(str, ids))}: one checkpoint continues once (restarts "
                       f"from one checkpoint can pick the luckiest continuation)")
    notes = [f"run {r.origin_id} resumed: segments " + ", ".join(
        f"run {s['run']} ({s['status']}, until {float(s['until']):.2f} s)"
        for s in r.details["resumed"].get("segments", [])) for r in resumed]
    return out, notes
