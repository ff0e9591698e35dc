"""Image JAX ops: Resize and Upsample (each axis resampled by an interpolation matrix)."""

from __future__ import annotations

from d500.backends.graph import registry

OPS, op = registry()
