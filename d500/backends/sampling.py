"""GridSample's coordinate arithmetic written once over a framework's primitives (its `Kit`):
from a grid of normalized coordinates to the taps each output reads along each spatial axis
(nearest, linear or cubic; zeros, border or reflection padding).

A framework gathers the taps' values and sums them in its own `image.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Kit:
    """The array primitives the tap arithmetic uses, as one framework provides them."""

    floor: Callable[[Any], Any]
    round: Callable[[Any], Any]
    where: Callable[[Any, Any, Any], Any]
    clip: Callable[[Any, float, float], Any]
    mod: Callable[[Any, Any], Any]  # the remainder with the divisor's sign
    ones_like: Callable[[Any], Any]
    true_like: Callable[[Any], Any]  # booleans, all true, of x's shape
    index: Callable[[Any], Any]  # float coordinates as the integers a gather takes


def mode(node) -> str:
    """The node's sampling mode in opset 20's names (linear, cubic, nearest)."""
    name = node.attr("mode", "linear")
    return {"bilinear": "linear", "bicubic": "cubic"}.get(name, name)


def _reflect(kit: Kit, x, lo, hi):
    """Reflect coordinates by the near border until they are inside [lo, hi] (ONNX GridSample)."""
    span = hi - lo
    below, above = lo - x, x - hi
    nb, na = kit.floor(below / span), kit.floor(above / span)
    rb, ra = below - nb * span, above - na * span
    low = kit.where(kit.mod(nb, 2) == 0, lo + rb, hi - rb)
    high = kit.where(kit.mod(na, 2) == 0, hi - ra, lo + ra)
    return kit.where(x < lo, low, kit.where(x > hi, high, x))


def _cubic_taps(t):
    a = -0.75
    t1, t2, t3 = t + 1, 1 - t, 2 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
            ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a]


def taps(kit: Kit, grid, dims: list[int], mode: str, padding: str, align: int) -> list[list]:
    """Per spatial axis of `dims`, the taps of every output position: (index, weight, valid)
    triples, `valid` false where a zeros-padded tap falls outside."""
    r = len(dims)
    taps_per_dim = []
    for i, d in enumerate(dims):
        n = grid[..., r - 1 - i]
        c = (n + 1) / 2 * (d - 1) if align else ((n + 1) * d - 1) / 2
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        if mode == "nearest":
            c = kit.round(c)
        if padding == "border":
            c = kit.where((c < lo) | (c > hi), kit.clip(c, 0.0, d - 1.0), c)
        elif padding == "reflection":
            c = _reflect(kit, c, lo, hi)
        if mode == "nearest":
            near = [(c, kit.ones_like(c))]
        else:
            base = kit.floor(c)
            t = c - base
            if mode == "linear":
                near = [(base, 1 - t), (base + 1, t)]
            else:
                near = list(zip([base - 1, base, base + 1, base + 2], _cubic_taps(t)))
        fixed = []
        for idx, w in near:  # where each tap reads, by the padding rule
            if padding == "border":
                valid, idx = kit.true_like(idx), kit.clip(idx, 0.0, d - 1.0)
            elif padding == "reflection":
                valid, idx = kit.true_like(idx), _reflect(kit, idx, lo, hi)
            else:
                valid = (idx >= 0) & (idx <= d - 1)
                idx = kit.clip(idx, 0.0, d - 1.0)
            fixed.append((kit.index(idx), w, valid))
        taps_per_dim.append(fixed)
    return taps_per_dim


def combinations(taps_per_dim: list[list]) -> Iterator[tuple[list, Any, Any]]:
    """Every choice of one tap per axis: (the indices along each axis, weight, valid)."""
    for combo in itertools.product(*taps_per_dim):
        weight, valid = combo[0][1], combo[0][2]
        for c in combo[1:]:
            weight, valid = weight * c[1], valid & c[2]
        yield [c[0] for c in combo], weight, valid
