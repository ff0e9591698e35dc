"""Making a chosen package run ready to re-run: its workload file checked against the rulebook,
the packaged submission written out and checked against the files the run recorded, its recipe
rebuilt from its recorded hyperparameters, and the thread count its frameworks had.

    prepared = prepare(pkg, run, rules_dir, submission_dir)   # Prepared, or
    # ConfigError (exit 2): the workload is not the rulebook's -- nothing may run;
    # Unreproducible: this run cannot be re-run faithfully from the package (reported, exit 1)
    preflight(prepared, data_dir)   # UsageError/DatasetError (exit 2): this machine cannot run it
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, D500Error, UsageError

# How long a level-0 validation may take before it is given up (seconds).
LEVEL0_TIMEOUT = 900.0


class Unreproducible(D500Error):
    """A chosen run that cannot be re-run faithfully from the package (its report says why)."""

    exit_code = 1


@dataclass
class Prepared:
    """A chosen run made ready to re-run (d500.competition.reproduce_job runs it)."""

    run: Any  # ExportedRun
    workload: Any  # the loaded workload (levels 2/3), None at level 0
    workload_file: Path | None  # the rulebook's file (None: a level-0 case given by shapes)
    submission_dir: Path
    params: dict[str, Any]  # recipe_with parameters (levels 2/3); the recorded settings (0)
    threads: int | None
    threads_from: str
    timeout: float
    trial: str = ""  # "study S trial T" of a tuning trial, as d500 tune and ledger list name it


def rulebook_file(pkg: Any, run: Any, rules_dir: Path) -> Path:
    """The rulebook's workload file a run ran under, after checking that the packaged file, the
    text the run recorded and the rulebook's are the same bytes; a ConfigError otherwise."""
    from d500.competition.check import run_workload
    from d500.competition.layout import sha256
    rel = run_workload(run, pkg.workload_files())
    packaged = pkg.workload_files().get(rel)
    where = f"run {run.origin_id}"
    if packaged is None:
        raise ConfigError(f"{pkg.path}: {where}: its workload file {rel} is not in the package")
    text = run.row.get("workload_text")
    if text is not None and text.encode("utf-8") != packaged:
        raise ConfigError(f"{pkg.path}: {where}: the packaged {rel} is not the workload text the "
                          "run recorded")
    ours = rules_dir / rel
    if not ours.resolve().is_relative_to(rules_dir.resolve()) or not ours.is_file():
        raise ConfigError(f"{pkg.path}: {where}: its workload file {rel} is not in the rulebook "
                          f"{rules_dir}; reproduction runs only the rules")
    if ours.read_bytes() != packaged:
        raise ConfigError(f"{pkg.path}: {where}: the packaged workload file {rel} differs from "
                          f"the rulebook's {ours} (sha256 {sha256(packaged)[:12]}… vs "
                          f"{sha256(ours.read_bytes())[:12]}…); reproduction runs only the rules")
    return ours


def write_submission(pkg: Any, folder: Path) -> Path:
    """The packaged submission files under `folder` (kept: the local ledger hashes them)."""
    root = folder.resolve()
    for rel, data in pkg.submission_files().items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.resolve().is_relative_to(root):
            raise D500Error(f"{pkg.path}: submission file {rel} would be written outside "
                            f"{folder}")
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
    return folder


def check_files(pkg: Any, run: Any, folder: Path) -> None:
    """The run's entry is the packaged one and every submission file it recorded is packed
    (by sha256); Unreproducible otherwise (the entry changed after the run)."""
    from d500.competition.layout import sha256
    from d500.workload import read_yaml
    _, data = read_yaml(folder / "submission.yaml")
    name = data.get("name") if isinstance(data, dict) else None
    if name != run.submission:
        raise Unreproducible(f"it is a run of '{run.submission}', the packaged submission is "
                             f"'{name}'")
    have = {sha256(data) for data in pkg.submission_files().values()}
    missing = sorted(p for p, h in run.submission_file_hashes.items() if h not in have)
    if missing:
        raise Unreproducible(f"it ran with submission file(s) not in the package "
                             f"({', '.join(Path(p).name for p in missing)}): the entry changed "
                             "after the run")


def pipeline_schedule_apart(hyper: dict[str, Any], entry: Any) -> dict[str, Any]:
    """A pipeline run's hyperparameters as runs record them now: one recorded before the
    pipeline's schedule had its own key held it (gpipe, 1f1b) in `schedule`, over the recipe's
    learning-rate schedule name, which is then the packaged entry's (that record lost it)."""
    if int(hyper.get("pipeline", 1)) < 2 or "pipeline_schedule" in hyper \
            or hyper.get("schedule") not in ("gpipe", "1f1b"):
        return hyper
    out = {**hyper, "pipeline_schedule": hyper["schedule"]}
    out.pop("schedule")
    lr = entry.recipe.hyperparameters_logged().get("schedule")
    return out if lr is None else {**out, "schedule": lr}


def rebuild(entry: Any, workload: Any, run: Any) -> dict[str, Any]:
    """The `recipe_with` parameters that give exactly the run's recorded hyperparameters (at
    level 3 with the world size's global batch and the entry's scheme); Unreproducible if none
    do (the submission changed after the run, or the run was not made from it)."""
    from d500.ledger.store import dumps
    hyper = pipeline_schedule_apart(run.hyperparameters, entry)
    names = set(entry.recipe.hp())
    params: dict[str, Any] = {k: v for k, v in hyper.items() if k in names}
    if "schedule" in hyper:
        params["schedule.name"] = hyper["schedule"]
    params.update({f"schedule.{k[len('schedule_'):]}": v for k, v in hyper.items()
                   if k.startswith("schedule_")})
    world = run.world_size if run.level == 3 else None
    batch = hyper.get("batch_size")
    if world and getattr(workload, "batch_mode", "global") == "per_rank":
        batch = batch // world if isinstance(batch, int) else batch
    if batch is not None:
        params["batch_size"] = batch
    params["precision"] = hyper.get("precision", "fp32")  # recorded only when not fp32
    try:
        recipe = entry.recipe_with(params)
        logged = recipe.hyperparameters_logged()
        if world:
            from d500.distributed import spec as specs
            total = workload.global_batch(recipe.batch_size, world)
            spec = specs.parse(entry.distributed, entry.path).logged()
            logged = {**logged, "batch_size": total,
                      "per_rank_batch_size": math.ceil(total / specs.data_ranks(world, spec)),
                      **spec}
    except D500Error as err:
        raise Unreproducible(f"its recorded hyperparameters do not fit the packaged submission "
                             f"({err})") from None
    if json.loads(dumps(logged)) != json.loads(dumps(hyper)):
        differ = sorted(k for k in set(logged) | set(hyper) if logged.get(k) != hyper.get(k))
        raise Unreproducible(f"the packaged submission does not give its recorded "
                             f"hyperparameters (differing: {', '.join(differ)}): the entry "
                             "changed after the run")
    return params


def origin_threads(env: dict[str, Any] | None, backend: str, world: int | None
                   ) -> tuple[int | None, str]:
    """The intra-op thread count the origin run's framework had, and how it is known: the count
    the run recorded (every level since each took --threads; a level-3 run's is one rank's),
    else, for a run recorded before that, inferred from the origin's CPU."""
    env = env or {}
    recorded = env.get("threads")
    if isinstance(recorded, dict) and isinstance(recorded.get("count"), int) and (
            recorded["count"] >= 1):
        how = recorded.get("set_by") or "how it was chosen not recorded"
        return recorded["count"], f"recorded by the origin; {how}"
    cpu = env.get("cpu") or {}
    usable = cpu.get("usable_cores") or cpu.get("logical_cores")
    inferred = "inferred, as the origin recorded no thread count: "
    if world and world > 1 and cpu.get("logical_cores"):
        return (max(1, int(cpu["logical_cores"]) // world),
                f"{inferred}the origin's {cpu['logical_cores']} cores shared by {world} ranks")
    from d500 import backends
    fw = backends.about(backend) if backend else None
    own = fw.default_threads(cpu) if fw is not None else None
    if own is not None:
        return own[0], f"{inferred}{fw.name}'s default on the origin, {own[1]}"
    if usable:
        return int(usable), f"{inferred}the framework's default on the origin, its usable cores"
    return None, ("unknown (the origin recorded neither a thread count nor its CPU): this "
                  "machine's default")


def environment_changes(env: dict[str, Any] | None, backend: str | None) -> list[str]:
    """How this machine differs from the origin's in what reassociates float arithmetic."""
    from d500 import backends, provenance
    env = env or {}
    theirs, ours = env.get("cpu") or {}, provenance.cpu()
    out = []
    for key, what in (("model", "CPU"), ("logical_cores", "cores")):
        if theirs.get(key) != ours.get(key):
            out.append(f"{what} {theirs.get(key)} -> {ours.get(key)}")
    fw = backends.framework(backend) if backend else None
    here = provenance.versions()
    for name in [*([fw[1]] if fw else []), "numpy"]:
        there = (env.get("packages") or {}).get(name)
        if name in here and there != here.get(name):
            out.append(f"{name} {there} -> {here.get(name)}")
    return out


def prepare(pkg: Any, run: Any, rules_dir: Path, folder: Path) -> Prepared:
    """A chosen run ready to re-run: the rulebook's workload (ConfigError unless the package's
    is the same), the packaged entry, the rebuilt recipe (Unreproducible if it cannot be)."""
    if run.level == 1:
        from d500.competition import reproduce_level1
        return reproduce_level1.prepare(pkg, run, rules_dir, folder)
    if run.level == 0:
        path = (rulebook_file(pkg, run, rules_dir)
                if run.row.get("workload_text") is not None else None)
        check_files(pkg, run, folder)
        return Prepared(run, None, path, folder, run.hyperparameters, None,
                        "the validation's own (one BLAS thread)", LEVEL0_TIMEOUT)
    from d500 import levels
    from d500.training import submission

    path = rulebook_file(pkg, run, rules_dir)
    workload = levels.of_file(path).load(path)
    check_files(pkg, run, folder)
    entry = submission.load(folder)
    params = rebuild(entry, workload, run)
    world = run.world_size if run.level == 3 else None
    threads, why = origin_threads(run.environment, run.backend, run.world_size)
    timeout = 3 * workload.max_seconds + 300 + (60 * world if world else 0)
    return Prepared(run, workload, path, folder, params, threads, why, timeout)


def preflight(prepared: Prepared, data_dir: str | None) -> None:
    """What this machine needs to re-run it, checked before any run starts (no framework is
    imported): the backend installed, the dataset's files present (levels 2 and 3), mpiexec
    for level 3."""
    import sys

    from d500 import backends
    run = prepared.run
    if run.level == 0:
        return
    if not backends.is_installed(run.backend):
        raise UsageError(f"run {run.origin_id} ran on backend '{run.backend}', which is not "
                         f"installed here (installed: {', '.join(backends.installed())})")
    if run.level == 1:
        return
    from d500.training.data.dataset import check_present
    check_present(prepared.workload.dataset["name"], data_dir)
    if run.level == 3 and run.world_size:
        from d500.distributed.launcher import mpiexec
        if mpiexec() is None:
            raise UsageError(f"run {run.origin_id} is a level-3 run at {run.world_size} ranks: "
                             f"it needs mpiexec beside {sys.executable} (pip install mpich "
                             "mpi4py)")
