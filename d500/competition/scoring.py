"""What scores in a package, per training result: the seed runs of the M > N window
(d500.training.window) and the RCP scale of their time (d500.competition.convergence.rcp_scale),
with their reasons, as the level-2 board computes them from the same sealed fields.

    check(ctx, report)   # report.scoring: one dict per result; report.checked: one line each

The window's order is the rules' seed order (d500.training.seeds.position), never the start
times or the ledger ids, which a sender who re-seals can rewrite: re-dating two runs (and their
MLLOGs) moves no run in it. A re-date is still named where it shows: the ledger hands out ids at
launch, in the same write transaction that stamps `started`, so a result whose start times run
against its ids by more than CLOCK_SLACK_S had a start time changed (the consistency check also
holds each `started` to its MLLOG's run_start).
"""

from __future__ import annotations

from typing import Any

from d500.competition.completeness import ids, is_outside_study, result_name, world

CLOCK_SLACK_S = 1.0  # a wall clock stepped back (NTP) between two launches: not a re-dating
# (the slack decides only whether a re-date is named: it moves no run in the scoring window)


def as_row(run: Any, text: bytes | None, rel: str) -> dict[str, Any]:
    """A packaged run as the ledger's row dict the scoring functions read (sealed fields only,
    and the workload text `d500 check` judges it by)."""
    def mapping(value: Any) -> dict[str, Any]:  # a malformed field: the consistency check's
        return value if isinstance(value, dict) else {}

    figures = {k: v for k, v in mapping(run.figures).items()  # numbers only: a forged string
               if isinstance(v, (int, float)) and not isinstance(v, bool)}  # is a miss here
    return {"id": run.origin_id, "status": run.status, "figures": figures,
            "hyperparameters": mapping(run.hyperparameters), "details": mapping(run.details),
            "started_unix": run.row.get("started"), "seed": run.seed, "level": run.level,
            "workload": run.workload, "submission": run.submission, "backend": run.backend,
            "world_size": world(run), "study": None,
            "workload_text": None if text is None else text.decode("utf-8", "replace"),
            "workload_file": rel}


def check(ctx: Any, report: Any) -> None:
    """Each training result's scored seed runs and RCP scale, as lines and as report.scoring."""
    from d500.competition.check import run_workload
    from d500.training import score, seeds
    results: dict[tuple[int, str, str, int], list[dict[str, Any]]] = {}
    packed = ctx.pkg.workload_files()
    for run in ctx.runs:
        if is_outside_study(run):
            rel = run_workload(run, packed)
            results.setdefault((run.level, run.workload, run.backend, world(run)), []).append(
                as_row(run, ctx.rules_text(rel), rel))
    for (level, workload, backend, ranks), rows in sorted(results.items()):
        name = result_name(level, workload, backend, ranks)
        report.problems += [f"scoring: {name}: {p}" for p in order_problems(rows)]
        out = seeds.sort_out(rows)
        if not out.scored:
            continue
        scale = score.rcp_of(out.scored)
        why = (out.choice.reason if out.choice is not None else
               f"all {len(out.scored)} required seed run(s) score (the workload allows no more)")
        report.scoring.append({
            "result": name, "scored_runs": [r["id"] for r in out.scored],
            "unscored_runs": [r["id"] for r in out.unscored], "why": why,
            "rcp_scale": scale.factor, "rcp_reason": scale.reason})
        line = f"scoring: {name}: run(s) {ids(r['id'] for r in out.scored)} score: {why}"
        if out.unscored:
            line += f"; run(s) {ids(r['id'] for r in out.unscored)} ran, not scored"
        report.checked.append(line)
        report.checked.append(f"scoring: {name}: RCP scale {scale.factor:.4g}: {scale.reason}")


def order_problems(rows: list[dict[str, Any]]) -> list[str]:
    """Runs whose start time puts them before a run the ledger launched earlier (a lower id)."""
    out, latest = [], None
    for row in sorted(rows, key=lambda r: r["id"]):
        started = row.get("started_unix")
        if not isinstance(started, (int, float)):
            continue
        if latest is not None and started < latest[1] - CLOCK_SLACK_S:
            out.append(f"run {row['id']} started at {started:.3f} (unix s), before run "
                       f"{latest[0]} ({latest[1]:.3f}), which the ledger launched first: a start "
                       f"time was changed")
        if latest is None or started > latest[1]:
            latest = (row["id"], started)
    return out
