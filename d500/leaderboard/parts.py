"""The leaderboard's parts: boards grouped by level, each part with the views its registered
level contributes (d500.levels); a level number no registered level claims renders generically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from d500 import levels, progress
from d500.leaderboard.ranking import Board
from d500.levels import View


@dataclass
class Part:
    """One level's part of the leaderboard: its title, its views, then its boards."""

    level: int | None
    title: str
    boards: list[Board]
    views: list[View] = field(default_factory=list)


def parts(boards: Sequence[Board], ledger: Any = None) -> list[Part]:
    """Group boards by level (in level order; runs without a level last) and ask each claimed
    level for its views of its boards. Views need the ledger the boards came from: without one
    (None) no level is asked."""
    grouped: dict[int | None, list[Board]] = {}
    for board in boards:
        grouped.setdefault(board.level, []).append(board)
    claimed = {lvl.number: lvl for lvl in levels.all_levels()} if grouped else {}
    out = []
    for number in sorted(grouped, key=lambda n: (n is None, n if n is not None else 0)):
        level = claimed.get(number) if number is not None else None
        title = (level.title if level is not None else
                 f"level {number}" if number is not None else "runs without a level")
        progress.step(f"{title}: views")
        views = list(level.views(grouped[number], ledger)) if level and ledger is not None \
            else []
        for view in views:
            if not isinstance(view, View):
                raise TypeError(f"{title}: views() returned {type(view).__name__}, not a View")
        out.append(Part(number, title, grouped[number], views))
    return out
