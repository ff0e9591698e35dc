"""argparse types the benchmarks share (no imports beyond argparse: some scripts take them before
they give their MPI ranks their cores, and so before NumPy loads)."""

from __future__ import annotations

import argparse


def repetitions(text: str) -> int:
    """A count of repetitions or rounds: an integer >= 2, the fewest whose median and quartiles
    a benchmark prints (1 ended in statistics' 'must have at least two data points', 0 in an
    empty median, each a traceback)."""
    if not text.strip().isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {text!r}")
    return int(text)
