"""d500 check's restarts step: resumed runs (d500.training.resume) listed with their segments,
and the ways a sender could use restarts to fool the reader flagged.

Flagged: a checkpoint that started more than one run (restarting from one checkpoint several
times and keeping the luckiest continuation), a resumed run whose checkpoint its parent never
sealed or whose parent is not in the package (a continuation of a run that is hidden), and a
resumed run whose clock starts before its parent was last seen (time of a segment left off).
"""

from __future__ import annotations

from typing import Any


def _sealed(run: Any) -> set[str]:
    """The checkpoint digests a run sealed: those it wrote and the one it started from."""
    found = {c.get("sha256") for c in run.details.get("checkpoints", [])}
    started = run.details.get("resumed") or {}
    return found | ({started["sha256"]} if "sha256" in started else set())


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
        before = float(info.get("before") or 0.0)
        if seen and before < max(seen):
            out.append(f"{where}: its clock starts at {before:.3f} s, before run "
                       f"{parent.origin_id}'s last evaluation at {max(seen):.3f} s (a segment's "
                       f"time left off)")
    for digest, ids in sorted(used.items()):
        if len(ids) > 1:
            out.append(f"checkpoint sha256 {digest[:12]}… was resumed by runs "
                       f"{', '.join(map(str, ids))}: one checkpoint continues once (restarts "
                       f"from one checkpoint can pick the luckiest continuation)")
    notes = [f"run {r.origin_id} resumed: segments " + ", ".join(
        f"run {s['run']} ({s['status']}, until {float(s['until']):.2f} s)"
        for s in r.details["resumed"].get("segments", [])) for r in resumed]
    return out, notes
