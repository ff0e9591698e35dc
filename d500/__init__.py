"""d500: a benchmark-and-competition harness for deep learning.

Four levels: operators, networks, training, distributed."""

from __future__ import annotations

__version__ = "0.1.0"
