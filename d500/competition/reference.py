"""Measuring a workload's reference convergence: N runs of one entry's default recipe with distinct
seeds through the real trainer (level 3: `mpiexec -n R d500 train` per seed), recorded in the
ledger like any other run, and the `reference_convergence` block written from their epochs.

    m = measure(workload, entry, "torch", runs=20, first_seed=1000, ledger=Ledger())
    text = block(m, command)          # the YAML block (with a comment), checked by parsing it
    write_block(workload.path, text)  # replaces the file's block, or appends one

The seeds are first_seed .. first_seed + N - 1 (default 1000 on): explorations of the entry (not
its required seeds, which the rules derive: d500.training.seeds), so a reference does not reuse an
entry's scored runs and the same command measures the same runs again (training is deterministic
for a seed on one backend).

A measurement continues what an earlier one recorded (level 2): a seed that already has a run
of the same rules, entry files, backend and recipe in the ledger, ended (succeeded, missed or
diverged), intact and not imported from a package, is not trained again; its first such run counts
(`recorded`), so running the command again never swaps a result for a luckier one, and a
measurement stopped part-way, in this session or an earlier one, picks up where it was.
`fresh=True` trains every seed anew.

The runs follow the workload's rules except its wall-clock budget (`budget.max_seconds`), which
is lifted to LIFTED_SECONDS unless asked to keep it: epochs to target do not depend on the
machine, but a loaded one cuts the slow runs short (measured here: LeNet-5 at 129 samples/s
with a load of 9 on 2 cores ran out of digits-lenet's 180 s after 19 epochs), which would leave
them out of the samples and make the reference look faster than it is. The runs record the
file they followed, $D500_HOME/reference/<level folder>/<workload>.yaml, which says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.competition import convergence
from d500.errors import CheckFailed, D500Error
from d500.training.precision import PRECISIONS

FIRST_SEED = 1000
LIFTED_SECONDS = 86_400.0  # the wall-clock budget of a reference run: a day
DEFAULT_ENTRY = {2: "sgd-momentum", 3: "sync"}  # the rulebook's references, by level


@dataclass
class Measurement:
    """The reference runs of one workload × entry × backend (× world size)."""

    workload: Any  # d500.training.workloads.Workload (or DistributedWorkload): the rules
    entry: Any  # d500.training.submission.Submission
    backend: str
    ranks: int | None  # level 3: the world size; None for level 2
    ran: Any = None  # the workload the runs followed (its wall-clock budget lifted, or as is)
    seeds: list[int] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)  # d500.training.trainer.Result per seed
    seconds: float = 0.0  # wall time of the whole measurement
    params: dict[str, Any] = field(default_factory=dict)  # a trial's point (none: the default)
    reused: list[int] = field(default_factory=list)  # seeds whose earlier run counts (recorded)

    @property
    def recipe(self) -> Any:
        """The recipe the runs train: the entry's default, with `params` put in."""
        return self.entry.recipe_with(self.params) if self.params else self.entry.recipe

    @property
    def metric(self) -> str:
        return "epochs"

    @property
    def precision(self) -> str:
        """What the runs compute in (the recipe's; `d500 reference --precision`)."""
        return self.recipe.precision

    @property
    def samples(self) -> list[float]:
        """The succeeded runs' epochs to target, in seed order."""
        return [r.figures[self.metric] for r in self.results
                if r.status == "succeeded" and math.isfinite(r.figures.get(self.metric, math.inf))]

    @property
    def batch_size(self) -> int:
        recipe = self.recipe
        if self.ranks is None:
            return recipe.batch_size
        return self.workload.global_batch(recipe.batch_size, self.ranks)


def default_ranks(workload: Any) -> int:
    """The world size a level-3 reference runs at: 2 when the workload allows it, else its
    smallest (a 2-core machine runs two ranks without oversubscribing)."""
    return 2 if 2 in workload.ranks else min(workload.ranks)


def measure(workload: Any, entry: Any, backend: str, runs: int, *, first_seed: int = FIRST_SEED,
            ranks: int | None = None, ledger: Any = None, data_dir: str | None = None,
            on_run: Callable[[int, Any], None] = lambda seed, result: None,
            progress: Callable[[str], Any] | None = None,
            keep_time_budget: bool = False, params: dict[str, Any] | None = None,
            fresh: bool = False) -> Measurement:
    """Run the entry's default recipe `runs` times (seeds first_seed, first_seed + 1, ...), each
    a ledger run; `on_run(seed, result)` after each. Level 3 launches `mpiexec -n ranks` per
    seed (rank 0 records into the same $D500_HOME ledger). `progress(title)`: a context
    manager taking the trainer's progress dicts (level 2 only). The wall-clock budget is
    lifted (module docstring) unless `keep_time_budget`. `params`: a hyperparameter point (a
    tuning trial's, level 2 only) the runs train at instead of the default recipe
    (d500.competition.trial_reference). A seed with a run recorded before is not trained again
    (`recorded`; level 2) unless `fresh`."""
    import time
    if runs < convergence.MIN_SAMPLES:
        raise D500Error(f"a reference needs at least {convergence.MIN_SAMPLES} runs, "
                        f"got {runs}")
    level3 = workload.level == 3
    if level3:
        ranks = ranks or default_ranks(workload)
        workload.check_world(ranks)
        workload.check_batch(entry.recipe.batch_size, ranks, str(entry.path))
    elif ranks is not None:
        raise D500Error(f"{workload.path}: '{workload.name}' is a level-2 workload: it trains "
                        f"in one process (--ranks is for level 3)")
    if level3 and params:
        raise D500Error(f"{workload.path}: '{workload.name}' is a level-3 workload: it has no "
                        f"tuning trials to record references at")
    m = Measurement(workload, entry, backend, ranks if level3 else None,
                    ran=workload if keep_time_budget else lifted(workload),
                    params=dict(params or {}))
    if m.params:
        m.recipe.check(workload)  # a point outside the rules fails before any run
    start = time.perf_counter()
    for seed in range(first_seed, first_seed + runs):
        earlier = None if fresh or level3 or ledger is None else recorded(m, seed, ledger)
        if earlier is not None:
            result = earlier
            m.reused.append(seed)
        elif level3:
            result = _launch(m, seed, data_dir)
        else:
            result = _train(m, seed, ledger, data_dir, progress)
        m.seeds.append(seed)
        m.results.append(result)
        on_run(seed, result)
    m.seconds = time.perf_counter() - start
    return m


ENDED = ("succeeded", "missed", "diverged")  # a reference run's outcomes (failed: a crash)


def recorded(m: Measurement, seed: int, ledger: Any) -> Any:
    """The first run in `ledger` that trained `seed` as `m` would (the same rules, read as
    YAML, reference_convergence aside; the entry's files by sha256; backend; recipe), ended
    (ENDED), intact (the ledger's seal and files verify) and not imported from a package, as a
    trainer Result; else None."""
    import hashlib

    import yaml

    from d500.training.trainer import Result
    rules = _rules(Path(m.ran.path).read_text(encoding="utf-8"))
    files = sorted(hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in m.entry.files)
    hyper = json.loads(json.dumps(m.recipe.hyperparameters_logged()))
    for run in ledger.runs(level=m.workload.level, workload=m.workload.name,
                           submission=m.entry.name, backend=m.backend):
        if (run["seed"] != seed or run["status"] not in ENDED or run["package"] is not None
                or run["study"] is not None or run["parent"] is not None
                or run["hyperparameters"] != hyper
                or sorted((run["submission_files"] or {}).values()) != files):
            continue
        try:
            same = _rules(run["workload_text"] or "") == rules
        except yaml.YAMLError:
            same = False
        if same and not ledger.verify_runs()[0].get(run["id"]):
            return Result(run["id"], run["status"], dict(run["figures"] or {}),
                          run["error"] or "")
    return None


def _rules(text: str) -> Any:
    """A workload file's rules as `recorded` compares them: its YAML, without a reference block."""
    import yaml
    data = yaml.safe_load(text)
    if isinstance(data, dict):
        for p in PRECISIONS:
            data.pop(convergence.key(p), None)
    return data


def _train(m: Measurement, seed: int, ledger: Any, data_dir: str | None,
           progress: Callable[[str], Any] | None) -> Any:
    from contextlib import nullcontext

    from d500.training.trainer import train
    title = f"{m.workload.name} / {m.entry.name} / {m.backend} seed {seed}"
    with (progress(title) if progress else nullcontext()) as bar:
        return train(m.ran, m.recipe, m.backend, seed, ledger=ledger,
                     data_dir=data_dir, submission=m.entry.name,
                     submission_files=m.entry.files, progress=bar)


def _launch(m: Measurement, seed: int, data_dir: str | None) -> Any:
    from d500.distributed.launcher import launch_train
    from d500.training.trainer import Result
    extra = ["--seed", str(seed), "--repeat", *(["--data", data_dir] if data_dir else [])]
    timeout = m.ran.max_seconds * 2 + 300  # the budget, the launch and the imports
    report = launch_train(m.ran.path, m.entry.path.parent, m.ranks, backend=m.backend,
                          extra=extra, timeout=timeout)
    if not report.runs:
        raise D500Error(f"mpiexec -n {m.ranks} d500 train {m.workload.name} seed {seed}: "
                        f"{report.problem}")
    run = report.runs[0]
    return Result(run["run_id"], run["status"], dict(run.get("figures") or {}),
                  run.get("error") or "")


def lifted(workload: Any) -> Any:
    """The workload with its wall-clock budget lifted to LIFTED_SECONDS, from a file of its own
    under $D500_HOME/reference/ whose header names the rulebook file and the change; a file
    already there with the same rules is kept as it is (runs recorded its bytes: a block written
    into the rulebook file since changes no rule)."""
    import hashlib

    import yaml

    from d500 import levels
    from d500.paths import home
    source = Path(workload.path)
    raw = source.read_bytes()
    data = _rules(raw.decode("utf-8"))
    data["budget"] = {**data["budget"], "max_seconds": LIFTED_SECONDS}
    out = home() / "reference" / source.parent.name / source.name
    if out.is_file() and _rules(out.read_text(encoding="utf-8")) == data:
        return levels.of_file(out).load(out)  # the same rules: the file earlier runs recorded
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# d500 reference: the rules of {_relative(source)} (sha256 "
        f"{hashlib.sha256(raw).hexdigest()}),\n"
        f"# its wall-clock budget lifted ({workload.max_seconds:g} s -> {LIFTED_SECONDS:g} s): "
        f"epochs to target do not\n# depend on the machine; a loaded one would cut slow "
        f"reference runs short.\n" + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return levels.of_file(out).load(out)


def command(m: Measurement, first_seed: int = FIRST_SEED) -> str:
    """The d500 command that measures `m` again."""
    where = _relative(m.workload.path)
    if m.workload.level == 2 and where.startswith("levels/"):
        where = m.workload.name  # found by name in the entry's level
    parts = ["d500 reference", where, "--entry", m.entry.name, "--backend", m.backend]
    if m.ranks is not None:
        parts += ["--ranks", str(m.ranks)]
    if m.precision != "fp32":
        parts += ["--precision", m.precision]
    if m.ran is m.workload:
        parts.append("--keep-time-budget")
    parts += ["--runs", str(len(m.seeds)), "--first-seed", str(first_seed)]
    parts += [f"--at {key}={json.dumps(value)}" for key, value in sorted(m.params.items())]
    return " ".join(parts)


def block(m: Measurement) -> str:
    """The `reference_convergence` YAML block (after a comment saying how it was measured),
    checked by parsing it back; fewer succeeded runs than a reference needs is CheckFailed."""
    import yaml
    samples = m.samples
    missed = [(s, r) for s, r in zip(m.seeds, m.results) if r.status != "succeeded"]
    if len(samples) < convergence.MIN_SAMPLES:
        seed, r = missed[0]
        raise CheckFailed(f"only {len(samples)} of {len(m.seeds)} reference runs reached the "
                          f"target (a reference needs {convergence.MIN_SAMPLES}); seed {seed}: "
                          f"{r.status}: {r.error}")
    wl = m.workload
    ordered = sorted(samples)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else \
        (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    at = f" at {m.ranks} ranks" if m.ranks is not None else ""
    lines = [
        (f"# Reference convergence (MLPerf's RCPs): epochs to the {wl.target:g} target of "
         f"{len(samples)} runs of"),
        (f"# {m.entry.name}'s default recipe (batch {m.batch_size}) on {m.backend}{at}"
         f"{'' if m.precision == 'fp32' else ' in ' + m.precision}, seeds "
         f"{m.seeds[0]}-{m.seeds[-1]}: median {_number(median)}, range "
         f"{_number(ordered[0])}-{_number(ordered[-1])}."),
        ("# d500 check flags results whose epochs lie below them (d500.competition.convergence)."
         if m.ran is m.workload else
         "# Wall-clock budget lifted for them; d500 check flags results whose epochs lie below."),
    ]
    if missed:
        lines.append(f"# {len(missed)} run(s) missed the target and are not among the samples: "
                     f"seeds {', '.join(str(s) for s, _ in missed)}.")
    lines += [
        f"{convergence.key(m.precision)}:",
        f"  metric: {m.metric}",
        f"  entry: {m.entry.name}",
        f"  backend: {m.backend}",
        f"  batch_size: {m.batch_size}",
        *([f"  ranks: {m.ranks}"] if m.ranks is not None else []),
        f"  command: {json.dumps(command(m, m.seeds[0]))}",
        f"  samples: [{', '.join(_number(v) for v in samples)}]",
        *([f"  precision: {m.precision}"] if m.precision != "fp32" else []),
    ]
    text = "\n".join(lines) + "\n"
    field = convergence.key(m.precision)
    convergence.parse_reference(yaml.safe_load(text)[field], wl.path, m.precision)
    return text


def write_block(path: Path, text: str, precision: str = "fp32") -> None:
    """Put the block of `precision` in a workload file: an existing block of that precision (with
    the comment right above it, from its line "# Reference convergence ...") is replaced, else the
    block is appended; another precision's block stays."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    key = f"{convergence.key(precision)}:"
    at = next((i for i, line in enumerate(lines) if line.startswith(key)), None)
    if at is None:
        body = "".join(lines)
        path.write_text(body + ("" if body.endswith("\n") or not body else "\n") + text,
                        encoding="utf-8")
        return
    end = at + 1
    while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
        end += 1
    top, i = at, at
    while i > 0 and lines[i - 1].startswith("#"):  # its comment: from the line that opens it
        i -= 1
        if lines[i].startswith("# Reference convergence"):
            top = i
            break
    path.write_text("".join(lines[:top]) + text + "".join(lines[end:]), encoding="utf-8")


def _relative(path: Path) -> str:
    """A workload path as the command shows it: relative to the rulebook's parent when it is a
    rulebook file (levels/3-distributed/x.yaml), else as given."""
    from d500.paths import rulebook
    resolved = Path(path).resolve()
    if resolved.is_relative_to(rulebook()):
        return str(Path("levels") / resolved.relative_to(rulebook()))
    return str(path)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"
