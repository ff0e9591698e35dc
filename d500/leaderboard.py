"""Leaderboards from the ledger alone: per workload, per (submission, backend), ranked by metric.

Rules come from the workload file's text stored with each run (metrics, rank_by, aggregate):
median with its spread over seeds and repetitions, or MLPerf's olympic mean, never the best run.
A run that missed its target counts as infinite time; failed, diverged, timed-out and interrupted
runs are counted and listed, never hidden. Output: Markdown, or one self-contained HTML file with
matplotlib PNG plots embedded as base64.
"""

from __future__ import annotations

import base64
import html
import io
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from d500 import metrics as _metrics
from d500.cli import ArgumentParser
from d500.errors import D500Error, UsageError
from d500.metrics import Metric
from d500.paths import home, write_output

NOT_COUNTED = ("interrupted", "running")
STATUS_ORDER = ("succeeded", "failed", "diverged", "timeout", "interrupted", "running")
FRAMEWORK_OF = {"torch": "torch", "tensorflow": "tensorflow-cpu", "onnxruntime": "onnxruntime",
                "reference": "numpy", "numpy": "numpy"}


@dataclass
class Entry:
    """One (submission, backend) of a workload: its runs and their aggregates."""

    submission: str
    backend: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    aggregate: dict[str, float | None] = field(default_factory=dict)
    spread: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    rank: int | None = None
    ratio: float | None = None
    problems: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(r["status"] for r in self.runs)

    @property
    def verified(self) -> bool:
        return not self.problems


@dataclass
class Board:
    """One workload (one version of its rules): the ranked entries and the runs not counted."""

    level: int | None
    workload: str
    workload_sha256: str | None
    metrics: list[Metric]
    rank_by: Metric | None
    how: str
    entries: list[Entry]
    version_note: str = ""
    description: str = ""

    @property
    def not_succeeded(self) -> list[dict[str, Any]]:
        return [r for e in self.entries for r in e.runs + e.trials if r["status"] != "succeeded"]


def build(ledger: Any = None, level: int | None = None, workload: str | None = None
          ) -> list[Board]:
    """Group, aggregate and rank every run of the ledger (optionally one level / workload)."""
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    runs = ledger.runs(level=level, workload=workload)
    per_run, general = ledger.verify_runs()
    envs = ledger.environments()
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:  # the same rules: the same workload file and the same model
        groups.setdefault((r["level"], r["workload"], r["workload_sha256"], r["model_sha256"]),
                          []).append(r)
    versions = Counter((lvl, name) for lvl, name, _, _ in groups)
    boards = []
    for (lvl, name, sha, model_sha), group in sorted(groups.items(), key=lambda kv: (
            kv[0][0] if kv[0][0] is not None else -1, kv[0][1] or "",
            -max(r["started_unix"] for r in kv[1]))):
        board = _board(lvl, name, sha, group, per_run, general, envs)
        if versions[(lvl, name)] > 1:
            model = f", model {model_sha[:12]}" if model_sha else ""
            board.version_note = (f"rules version {sha[:12] if sha else 'unrecorded'}{model}: "
                                  "the workload file or the model changed between runs; "
                                  "versions are ranked apart")
        boards.append(board)
    return boards


def _rules(group: list[dict[str, Any]]) -> tuple[list[str], str | None, str | None, str]:
    text = group[-1]["workload_text"]
    data: dict[str, Any] = {}
    if text:
        try:
            loaded = yaml.safe_load(text)
            data = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError:
            data = {}
    names = [str(n) for n in data.get("metrics") or []]
    if not names:  # no workload file recorded: every figure the runs recorded, unranked
        names = sorted({n for r in group for n in r["figures"]})
        return names, None, None, ""
    rank_by = str(data.get("rank_by") or names[0])
    return names, rank_by, data.get("aggregate"), str(data.get("description") or "")


def _board(level: int | None, name: str, sha: str | None, group: list[dict[str, Any]],
           per_run: dict[int, list[str]], general: list[str], envs: dict[int, Any]) -> Board:
    names, rank_name, how, description = _rules(group)
    known = []
    for n in names:
        try:
            known.append(_metrics.get(n))
        except D500Error:  # a metric file removed since the run: skip the column, keep runs
            continue
    rank_by = next((m for m in known if m.name == rank_name), None)
    entries: dict[tuple[str, str], Entry] = {}
    for r in group:
        key = (r["submission"] or "", r["backend"] or "")
        entry = entries.setdefault(key, Entry(*key))
        (entry.trials if r["study"] is not None else entry.runs).append(r)
        entry.problems += per_run.get(r["id"], [])
        env = envs.get(r["environment"])
        if env:
            line = _short_provenance(env, r["backend"])
            if line not in entry.provenance:
                entry.provenance.append(line)
    for entry in entries.values():
        entry.problems += general
        for metric in known:
            vals = _values(entry.runs, metric)
            entry.values[metric.name] = vals
            entry.aggregate[metric.name] = _metrics.aggregate(vals, how or metric.aggregate)
            entry.spread[metric.name] = _metrics.spread(vals)
    ordered = sorted(entries.values(), key=lambda e: (
        rank_by.sort_key(e.aggregate.get(rank_by.name)) if rank_by else 0, e.submission,
        e.backend))
    if rank_by is not None:
        best = rank_by.best(e.aggregate.get(rank_by.name) for e in ordered
                            if e.aggregate.get(rank_by.name) is not None
                            and math.isfinite(e.aggregate[rank_by.name]))
        for i, e in enumerate(ordered, 1):
            value = e.aggregate.get(rank_by.name)
            e.rank = i if value is not None else None
            e.ratio = rank_by.ratio_to_best(value, best)
    return Board(level, name, sha, known, rank_by, how or "per-metric default",
                 ordered, description=description)


def _values(runs: list[dict[str, Any]], metric: Metric) -> list[float]:
    """The values a metric takes over an entry's runs: succeeded runs give their figure; a run
    that finished without it (missed target, failed, diverged, timed out) counts as the metric's
    MISSING value (infinity for time-to-accuracy) or not at all; interrupted runs never count."""
    vals = []
    for r in runs:
        if r["status"] in NOT_COUNTED:
            continue
        value = r["figures"].get(metric.name) if r["status"] == "succeeded" else None
        if value is None:
            value = metric.missing
        if value is not None:
            vals.append(float(value))
    return vals


def _short_provenance(env: dict[str, Any], backend: str | None) -> str:
    cpu = env.get("cpu", {})
    gib = (env.get("memory_bytes") or 0) / 2**30
    pk = env.get("packages", {})
    wanted = [FRAMEWORK_OF.get(backend or "", ""), "tensorflow", "onnx", "numpy"]
    vers = [f"{k} {pk[k]}" for k in dict.fromkeys(wanted) if k and pk.get(k)]
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or [])
    git = env.get("git") or {}
    commit = (git.get("commit") or "")[:8] + ("+dirty" if git.get("dirty") else "")
    parts = [f"{cpu.get('model', '?')} ×{cpu.get('logical_cores', '?')}", f"{gib:.0f} GiB"]
    if gpus:
        parts.append(gpus)
    if env.get("peak_flops"):
        parts.append(f"peak {env['peak_flops'] / 1e9:.0f} GFLOP/s")
    parts += vers
    if commit:
        parts.append(f"git {commit}")
    return " · ".join(parts)


# ---------------------------------------------------------------- formatting

def _cell(entry: Entry, metric: Metric) -> str:
    value = entry.aggregate.get(metric.name)
    vals = entry.values.get(metric.name, [])
    if value is None:
        return "—"
    text = metric.format(value)
    lo_hi = entry.spread.get(metric.name)
    if lo_hi and len(vals) > 1 and lo_hi[0] != lo_hi[1]:
        text += f" [{metric.format(lo_hi[0], unit=False)} – {metric.format(lo_hi[1], unit=False)}]"
    return f"{text} (n={len(vals)})"


def _counts(board: Board, entry: Entry) -> str:
    c = entry.counts
    text = " ".join(f"{c[s]} {s}" for s in STATUS_ORDER if c[s]) or "0"
    metric = board.rank_by
    if metric is not None and metric.missing is not None:
        missed = sum(1 for r in entry.runs if r["status"] == "succeeded"
                     and (r["figures"].get(metric.name) is None
                          or r["figures"][metric.name] == metric.missing))
        if missed:
            text += f" ({missed} missed the target)"
    return text


def _ratio(entry: Entry) -> str:
    if entry.ratio is None:
        return "—"
    return "∞" if math.isinf(entry.ratio) else f"{entry.ratio:.2f}×"


def _verify_text(entry: Entry) -> str:
    return "✓ intact" if entry.verified else f"✗ {len(entry.problems)} problem(s)"


def _title(board: Board) -> str:
    level = f"level {board.level}" if board.level is not None else "level ?"
    return f"{level} · {board.workload}"


def _rule_line(board: Board) -> str:
    if board.rank_by is None:
        return "unranked: no workload file was recorded with these runs"
    how = board.how if board.how in _metrics.AGGREGATIONS else "median"
    explain = ("median over seeds and repetitions, [min – max] spread" if how == "median" else
               "MLPerf olympic mean (best and worst run dropped), [min – max] spread")
    missing = ("; a run that missed its target, failed or diverged counts as ∞"
               if board.rank_by.missing is not None else "")
    return (f"ranked by {board.rank_by.name} ({board.rank_by.direction} is better), "
            f"{explain}{missing}; interrupted runs are listed, not counted")


def _columns(board: Board) -> list[Metric]:
    """The ranking metric first, then the workload's other metrics in its order."""
    if board.rank_by is None:
        return board.metrics
    return [board.rank_by] + [m for m in board.metrics if m.name != board.rank_by.name]


def _headers(board: Board) -> list[str]:
    cols = ["rank", "submission", "backend"] + [m.label for m in _columns(board)]
    if board.rank_by is not None:
        cols.insert(4, "× best")
    return cols + ["runs", "tuning trials", "verify", "provenance"]


def _row(board: Board, e: Entry) -> list[str]:
    cells = ["—" if e.rank is None else str(e.rank), e.submission, e.backend]
    cells += [_cell(e, m) for m in _columns(board)]
    if board.rank_by is not None:
        cells.insert(4, _ratio(e))
    tuning = sum(r["duration"] or 0.0 for r in e.trials)
    trials = f"{len(e.trials)} ({_metrics.format_duration(tuning)})" if e.trials else "0"
    return cells + [_counts(board, e), trials, _verify_text(e), " | ".join(e.provenance) or "—"]


def _excluded_rows(board: Board) -> list[list[str]]:
    return [[str(r["id"]), r["submission"] or "", r["backend"] or "", r["status"],
             "" if r["seed"] is None else str(r["seed"]),
             "trial" if r["study"] is not None else "run", (r["error"] or "")[:120]]
            for r in board.not_succeeded]


EXCLUDED_HEADERS = ["run", "submission", "backend", "status", "seed", "kind", "error"]


def markdown(boards: list[Board], source: str = "") -> str:
    """The leaderboard as Markdown tables (for terminals and READMEs)."""
    out = ["# d500 leaderboard", ""]
    if source:
        out += [f"_{source}_", ""]
    if not boards:
        out.append("No runs recorded yet.")
    for board in boards:
        out += [f"## {_title(board)}", ""]
        if board.version_note:
            out += [f"_{board.version_note}_", ""]
        out += [f"_{_rule_line(board)}_", ""]
        heads = _headers(board)
        out.append("| " + " | ".join(heads) + " |")
        out.append("|" + "|".join("---" for _ in heads) + "|")
        for e in board.entries:
            out.append("| " + " | ".join(_md(c) for c in _row(board, e)) + " |")
        excluded = _excluded_rows(board)
        if excluded:
            out += ["", f"Runs not counted as success ({len(excluded)}):", ""]
            out.append("| " + " | ".join(EXCLUDED_HEADERS) + " |")
            out.append("|" + "|".join("---" for _ in EXCLUDED_HEADERS) + "|")
            out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in excluded]
        problems = sorted({p for e in board.entries for p in e.problems})
        if problems:
            out += ["", "Integrity problems (`d500 ledger verify`):", ""]
            out += [f"- {p}" for p in problems]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.num{text-align:right;white-space:nowrap}
tr.first td{background:#eef8ee}.bad{color:#b00}.ok{color:#070}.note{color:#555;font-size:.9em}
img{max-width:100%;border:1px solid #ddd;margin:.4em 0}
"""


def html_page(boards: list[Board], ledger: Any, source: str = "") -> str:
    """The leaderboard as one self-contained HTML file (inline CSS, PNG plots as data URIs)."""
    esc = html.escape
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<title>d500 leaderboard</title>", f"<style>{CSS}</style></head><body>",
             "<h1>d500 leaderboard</h1>"]
    if source:
        parts.append(f"<p class='note'>{esc(source)}</p>")
    if not boards:
        parts.append("<p>No runs recorded yet.</p>")
    for i, board in enumerate(boards):
        parts.append(f"<section class='workload' id='w{i}'><h2>{esc(_title(board))}</h2>")
        if board.description:
            parts.append(f"<p>{esc(board.description)}</p>")
        if board.version_note:
            parts.append(f"<p class='note'>{esc(board.version_note)}</p>")
        parts.append(f"<p class='note'>{esc(_rule_line(board))}</p>")
        heads = _headers(board)
        parts.append("<table class='board'><thead><tr>" + "".join(
            f"<th>{esc(h)}</th>" for h in heads) + "</tr></thead><tbody>")
        for e in board.entries:
            cls = " class='first'" if e.rank == 1 else ""
            cells = _row(board, e)
            tds = []
            for h, c in zip(heads, cells):
                klass = "num" if h not in ("submission", "backend", "provenance", "runs",
                                           "verify") else ""
                if h == "verify":
                    klass = "ok" if e.verified else "bad"
                title = f" title='{esc(' / '.join(e.problems))}'" if h == "verify" and \
                    e.problems else ""
                tds.append(f"<td class='{klass}'{title}>{esc(c)}</td>")
            parts.append(f"<tr{cls}>" + "".join(tds) + "</tr>")
        parts.append("</tbody></table>")
        for caption, png in _plots(board, ledger):
            data = base64.b64encode(png).decode()
            parts.append(f"<figure><img alt='{esc(caption)}' src='data:image/png;base64,"
                         f"{data}'><figcaption class='note'>{esc(caption)}</figcaption></figure>")
        excluded = _excluded_rows(board)
        if excluded:
            parts.append(f"<h3>Runs not counted as success ({len(excluded)})</h3>")
            parts.append("<table class='excluded'><thead><tr>" + "".join(
                f"<th>{h}</th>" for h in EXCLUDED_HEADERS) + "</tr></thead><tbody>")
            parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                      for row in excluded]
            parts.append("</tbody></table>")
        problems = sorted({p for e in board.entries for p in e.problems})
        if problems:
            parts.append("<h3 class='bad'>Integrity problems (d500 ledger verify)</h3><ul>")
            parts += [f"<li>{esc(p)}</li>" for p in problems]
            parts.append("</ul>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _plots(board: Board, ledger: Any) -> list[tuple[str, bytes]]:
    """A strip plot of the ranking metric per entry (every run a dot, the aggregate a bar,
    infinite values at the top in red) and, when runs recorded evaluations, their curves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plots = []
    metric = board.rank_by or (board.metrics[0] if board.metrics else None)
    entries = [e for e in board.entries if e.values.get(metric.name)] if metric else []
    if metric and entries:
        fig = Figure(figsize=(7, 0.5 + 0.45 * len(entries)), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        finite = [v for e in entries for v in e.values[metric.name] if math.isfinite(v)]
        top = (max(finite) * 1.15 if finite and max(finite) > 0 else 1.0)
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
        ax.set_yticks(range(len(entries)), [f"{e.submission} / {e.backend}" for e in entries])
        ax.invert_yaxis()
        ax.set_xlabel(f"{metric.name} ({metric.unit})" if metric.unit else metric.name)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        plots.append((f"{metric.name} of every counted run (dots; red = ∞, e.g. target "
                      f"missed) and the aggregate (bar)", _png(fig)))
    curves = [(e, r, ledger.evaluations(r["id"])) for e in board.entries for r in e.runs]
    curves = [c for c in curves if c[2]]
    if curves:
        name = next(iter(curves[0][2][0]["metrics"]), None)
        if name:
            fig = Figure(figsize=(7, 3.5), dpi=100)
            FigureCanvasAgg(fig)
            ax = fig.add_subplot()
            labels: dict[str, str] = {}
            for e, r, evals in curves:
                pts = [(ev["wall_time"], ev["metrics"][name]) for ev in evals
                       if name in ev["metrics"] and ev["wall_time"] is not None]
                if not pts:
                    continue
                key = f"{e.submission} / {e.backend}"
                first = key not in labels
                color = labels.setdefault(key, f"C{len(labels) % 10}")
                ax.plot(*zip(*pts), color=color, alpha=0.8, marker=".",
                        label=key if first else None)
            ax.set_xlabel("wall time since run start (s)")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            if labels:
                ax.legend(fontsize=8)
            fig.tight_layout()
            plots.append((f"{name} over wall time, every run", _png(fig)))
    return plots


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ---------------------------------------------------------------- entry points

def render(ledger: Any = None, level: int | None = None, workload: str | None = None,
           fmt: str = "md") -> str:
    """The leaderboard as Markdown ("md") or a self-contained HTML page ("html")."""
    from d500.ledger import Ledger

    ledger = ledger if ledger is not None else Ledger()
    boards = build(ledger, level, workload)
    source = (f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {ledger.path} "
              f"({sum(len(e.runs) + len(e.trials) for b in boards for e in b.entries)} runs)")
    if fmt == "md":
        return markdown(boards, source)
    if fmt == "html":
        return html_page(boards, ledger, source)
    raise UsageError(f"unknown leaderboard format '{fmt}' (choose from md, html)")


def write_html(path: str | Path | None = None, ledger: Any = None, level: int | None = None,
               workload: str | None = None) -> Path:
    """Write the HTML leaderboard (default $D500_HOME/leaderboard.html); returns its path."""
    out = Path(path) if path is not None else home() / "leaderboard.html"
    return write_output(out, render(ledger, level, workload, fmt="html"))


def main(argv: list[str], prog: str = "d500 leaderboard") -> int:
    parser = ArgumentParser(prog=prog, description="Rank recorded runs by the metric "
                            "definitions; reads only the ledger.")
    parser.add_argument("--level", type=int, choices=(0, 1, 2, 3))
    parser.add_argument("--workload")
    parser.add_argument("--format", choices=("md", "html"), default="md")
    parser.add_argument("--out", metavar="FILE", help="write here (HTML default: "
                        "$D500_HOME/leaderboard.html)")
    parser.add_argument("--ledger", metavar="FILE", help="a ledger file other than "
                        "$D500_HOME/ledger.sqlite")
    args = parser.parse_args(argv)
    from d500.ledger import Ledger

    ledger = Ledger.open_for_reading(args.ledger)
    try:
        if args.format == "html":
            out = write_html(args.out, ledger, args.level, args.workload)
            print(f"wrote {out}")
        else:
            text = render(ledger, args.level, args.workload, fmt="md")
            if args.out:
                print(f"wrote {write_output(args.out, text)}")
            else:
                sys.stdout.write(text)
    finally:
        ledger.close()
    return 0
