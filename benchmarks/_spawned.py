"""A measurement run in a fresh spawned process, its result taken from its queue (guard.py,
keeper.py)."""

from __future__ import annotations

import multiprocessing
from typing import Any


def result(target: Any, *args: Any) -> Any:
    """What `target(queue, *args)`, run in a fresh spawned process, put on its queue."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(queue, *args))
    process.start()
    out = queue.get(timeout=300)
    process.join(60)
    return out
