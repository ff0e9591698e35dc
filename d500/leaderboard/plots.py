"""The leaderboard's PNG plots, drawn with matplotlib's Agg canvas (no display, no pyplot state):
per board a strip plot of the ranking metric (one panel per machine when the board ranks per
machine) and the evaluation curves; `figure`/`png` for the plots levels add to their views.

    fig = figure(7, 3)            # a Figure on its own Agg canvas
    fig.add_subplot().plot(...)
    data = png(fig)               # PNG bytes, for a View's plots
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any

from d500.leaderboard.environments import Legend, hardware_text
from d500.leaderboard.ranking import Board, Entry

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def figure(width: float, height: float, dpi: int = 100) -> Any:
    """A matplotlib Figure of this size (inches) attached to an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png(fig: Any) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header; ValueError when `data` is not a PNG."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def board_plots(board: Board, ledger: Any = None, legend: Legend | None = None
                ) -> list[tuple[str, bytes]]:
    """(caption, PNG) of the board's strip plot and, when its runs recorded evaluations (read
    from `ledger`), their curves over wall time. Entries of a board holding several machines
    are named with their environments' labels in `legend`."""
    plots = []
    strip = strip_plot(board, legend)
    if strip is not None:
        plots.append(strip)
    curves = curves_plot(board, ledger, legend) if ledger is not None else None
    if curves is not None:
        plots.append(curves)
    return plots


def entry_name(board: Board, entry: Entry, legend: Legend | None = None) -> str:
    """"submission / backend", marked when its runs came in a package or reproduce one (so no
    two rows read alike), with its environment labels when the board spans machines."""
    name = f"{entry.submission} / {entry.label}"
    sha = ((entry.package or {}).get("sha256") or "")[:8]
    if entry.package:
        name += (f" (reproduction of {sha})" if entry.package.get("reproduction")
                 else f" (organiser's seeds, package {sha})" if entry.package.get("drawn")
                 else f" (package {sha})")
    if len(board.machines) < 2:
        return name
    legend = legend if legend is not None else Legend.of([board])
    return f"{name} ({', '.join(legend.labels(entry)) or '?'})"


def strip_plot(board: Board, legend: Legend | None = None) -> tuple[str, bytes] | None:
    """The ranking metric per entry: every counted run a dot (infinite values at the right edge
    in red), the aggregate a bar; one panel per machine, each with its own axis, when the board
    ranks per machine (its times are not to be compared across hardware, even by eye)."""
    metric = board.rank_by or (board.metrics[0] if board.metrics else None)
    entries = [e for e in board.entries if e.values.get(metric.name)] if metric else []
    if metric is None or not entries:
        return None
    panels: dict[str, list[Entry]] = {}
    for e in entries:
        panels.setdefault(e.machine if board.per_machine else "", []).append(e)
    titled = len(panels) > 1
    fig = figure(7, sum(0.5 + 0.45 * len(group) + (0.5 if titled else 0)
                        for group in panels.values()))
    axes = fig.subplots(len(panels), 1, squeeze=False,
                        height_ratios=[len(g) + 1 for g in panels.values()])[:, 0]
    for ax, group in zip(axes, panels.values(), strict=True):
        _strip(ax, board, group, metric, legend)
        if titled:
            ax.set_title(hardware_text(group[0].environments[0] if group[0].environments
                                       else None), fontsize=8, loc="left")
    fig.tight_layout()
    caption = (f"{metric.name} of every counted run (dots; red = ∞, e.g. target missed) and "
               f"the aggregate (bar)" + ("; one panel per machine" if titled else ""))
    return caption, png(fig)


def _strip(ax: Any, board: Board, entries: list[Entry], metric: Any,
           legend: Legend | None) -> None:
    finite = [v for e in entries for v in e.values[metric.name] if math.isfinite(v)]
    top = max(finite) * 1.15 if finite and max(finite) > 0 else 1.0
    from matplotlib.ticker import MaxNLocator

    for y, e in enumerate(entries):
        vals = e.values[metric.name]
        xs = [v if math.isfinite(v) else top for v in vals]
        colors = ["tab:blue" if math.isfinite(v) else "tab:red" for v in vals]
        ax.scatter(xs, [y] * len(xs), c=colors, s=22, zorder=3)
        if any(not math.isfinite(v) for v in vals):
            ax.annotate("∞", (top, y), xytext=(6, 0), textcoords="offset points",
                        color="tab:red", va="center")
        agg = e.aggregate.get(metric.name)
        if agg is not None:
            ax.plot([agg if math.isfinite(agg) else top] * 2, [y - 0.3, y + 0.3],
                    color="black", lw=2)
    ax.set_yticks(range(len(entries)), [entry_name(board, e, legend) for e in entries])
    ax.set_ylim(len(entries) - 0.5, -0.5)  # the first entry on top
    ax.set_xlabel(f"{metric.name} ({metric.unit})" if metric.unit else metric.name)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.grid(axis="x", alpha=0.3)


def curves_plot(board: Board, ledger: Any, legend: Legend | None = None
                ) -> tuple[str, bytes] | None:
    """The first evaluation metric over wall time (log scale: one slow run does not squeeze
    the others against zero), one line per run, one colour per entry, the legend below."""
    curves = [(e, ledger.evaluations(r["id"])) for e in board.entries for r in e.runs]
    curves = [c for c in curves if c[1]]
    name = next(iter(curves[0][1][0]["metrics"]), None) if curves else None
    if not name:
        return None
    fig = figure(7, 4.2)
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for e, evals in curves:
        pts = [(ev["wall_time"], ev["metrics"][name]) for ev in evals
               if name in ev["metrics"] and ev["wall_time"] is not None and ev["wall_time"] > 0]
        if not pts:
            continue
        key = entry_name(board, e, legend)
        first = key not in colors
        color = colors.setdefault(key, f"C{len(colors) % 10}")
        ax.plot(*zip(*pts), color=color, alpha=0.8, marker=".", label=key if first else None)
    ax.set_xscale("log")
    ax.set_xlabel("wall time since run start (s, log scale)")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3, which="both")
    if colors:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                  frameon=False)
    fig.tight_layout()
    return f"{name} over wall time, every run", png(fig)
