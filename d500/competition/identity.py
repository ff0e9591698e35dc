"""d500 check's identity step: the machine each run's sealed MLLOG names against its provenance,
and the d500 version, commit and tree state the runs were made with against the organiser's.

A platform that differs is a problem (the provenance was swapped after the run); another d500
(version, commit) or a dirty tree is a note: a warning line, a problem under `d500 check --strict`.
"""

from __future__ import annotations

from typing import Any

from d500 import mllog

PLATFORM = mllog.SUBMISSION_PLATFORM


def cpu_claim(environment: dict[str, Any]) -> str:
    """How the run's own MLLOG opens its platform line (provenance.summary): 'model ×cores,'."""
    cpu = environment.get("cpu") if isinstance(environment.get("cpu"), dict) else {}
    return f"{cpu.get('model', '?')} ×{cpu.get('logical_cores', '?')},"


def logged_platform(text: str) -> str | None:
    """The value of a log's submission_platform line (None: it has none that is text)."""
    records, _ = mllog.parse_text(text)
    value = next((r["value"] for r in records if r["key"] == PLATFORM), None)
    return value if isinstance(value, str) else None


def platform_problems(runs: list[Any]) -> list[str]:
    """One line per run whose MLLOG names a machine its provenance does not."""
    found = []
    for run in runs:
        if not isinstance(run.environment, dict) or run.mllog_text is None:
            continue
        logged = logged_platform(run.mllog_text)
        claim = cpu_claim(run.environment)
        if logged is not None and not logged.startswith(claim):
            found.append(f"run {run.origin_id}: its MLLOG's {PLATFORM} is {logged!r}, but its "
                         f"provenance (environments/{run.environment_digest}.json) says "
                         f"{claim.rstrip(',')!r}")
    return found


def made_with(environment: dict[str, Any]) -> tuple[str | None, str | None, bool | None]:
    """(d500 version, git commit, dirty tree) a provenance records."""
    packages = environment.get("packages") if isinstance(environment.get("packages"), dict) \
        else {}
    git = environment.get("git") if isinstance(environment.get("git"), dict) else {}
    version, commit, dirty = packages.get("d500"), git.get("commit"), git.get("dirty")
    return (version if isinstance(version, str) else None,
            commit if isinstance(commit, str) else None,
            dirty if isinstance(dirty, bool) else None)


def ours() -> tuple[str | None, str | None, bool | None]:
    """(version, commit, dirty) of the d500 running this check."""
    from d500 import provenance
    return made_with({"packages": provenance.versions(), "git": provenance.git()})


def describe(made: tuple[str | None, str | None, bool | None]) -> str:
    version, commit, dirty = made
    at = f" at commit {commit[:12]}" if commit else " at an unrecorded commit"
    return f"d500 {version or '(unrecorded version)'}{at}" + (" (dirty tree)" if dirty else "")


def version_notes(runs: list[Any], mine: tuple[str | None, str | None, bool | None],
                  manifest_version: Any = None) -> list[str]:
    """One line per distinct d500 (version, commit, dirty) the runs were made with that is not
    this d500 at a clean tree; the packager's version (manifest) when it is not ours."""
    groups: dict[tuple[str | None, str | None, bool | None], list[int]] = {}
    for run in runs:
        if isinstance(run.environment, dict):
            groups.setdefault(made_with(run.environment), []).append(run.origin_id)
    notes = []
    for made, ids in sorted(groups.items(), key=lambda kv: kv[1]):
        if made[:2] == mine[:2] and made[2]:  # the same commit: only the tree differs
            notes.append(f"identity: run(s) {_ids(ids)} were made with {describe(made)}, the "
                         f"commit this check runs, with uncommitted changes no check can see")
        elif made[:2] != mine[:2]:
            notes.append(f"identity: run(s) {_ids(ids)} were made with {describe(made)}; this "
                         f"check runs {describe(mine)}")
    if isinstance(manifest_version, str) and manifest_version != mine[0]:
        notes.append(f"identity: the package was made by d500 {manifest_version}; this check "
                     f"runs d500 {mine[0]}")
    return notes


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def check_identity(ctx: Any, report: Any) -> None:
    """The identity step of d500.competition.check: platform problems, version notes."""
    report.problems += [f"identity: {p}" for p in platform_problems(ctx.runs)]
    report.notes += version_notes(ctx.runs, ours(), ctx.pkg.manifest.get("d500"))
    logged = sum(1 for r in ctx.runs if r.mllog_text is not None
                 and isinstance(r.environment, dict))
    report.checked.append(f"identity: {logged} MLLOG platform line(s) against their "
                          f"provenance; the d500 version and commit of {len(ctx.runs)} run(s)")
