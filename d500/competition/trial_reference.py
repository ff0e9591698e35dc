"""Reference trials: reference runs at a tuning trial's hyperparameters, against which `d500 check`
tests each study's best trial, as it tests seed runs against `reference_convergence`.

    refs = read(text, "2-training/digits-mlp.trials.json")   # [TrialReference, ...]
    ref = find(refs, "torch", trial_run.hyperparameters)    # the one at its hyperparameters
    convergence.check_epochs(ref.reference, [epochs], alpha=convergence.ALPHA / trials)
    write(path, entry_of(measurement, command))              # `d500 reference --at/--trials`

Isolation keeps the held-out data out of the entry's worker, but an entry may rebuild it from the
public dataset and train on it in its tuning trials only (it can tell a trial by a hyperparameter
of its own that only its search space sets): its hyperparameters are then chosen on leaked data,
while its seed runs stay honest and pass the seed-run test. The organiser records reference runs
(the reference entry's code, default sgd-momentum) at the hyperparameters of each study's best
trial (`d500 reference WORKLOAD --trials PACKAGE`, or an explicit point with `--at K=V`), and
check flags a best trial whose epochs to target lie below them.

**Where they live.** In `<workload>.trials.json` beside the workload file in the rulebook folder
(levels/ or `--rules DIR`), never in the workload file: the workload file is the rules, which a
package carries byte for byte and check compares by sha256, and reference trials are recorded
after packages arrive (at their best trials' points), so writing them into the workload would
make every package made before differ from the rulebook. Each fact has one place: the seed runs'
reference in the workload's `reference_convergence` block, each trial point's reference runs once
in the file beside it (recording a point again replaces its entry). Check reads the organiser's
file only, never one a package carries.

**Same hyperparameters.** A trial matches a reference point when the trial run recorded every
hyperparameter the reference runs recorded (d500.training.recipe.hyperparameters_logged: learning
rate, momentum, batch size, schedule, ...) with the same value, the optimizer's name and `native`
apart (the entry's code is what is tested, so its name differs from the reference entry's), on
the same backend. Hyperparameters the reference does not know (an entry's own) are not compared.

**The test.** The seed-run test (convergence.check_epochs) on one value, the study's best trial,
against the reference runs at its point. A study's best trial is its fastest of T, so even an
honest one lies low in its own distribution: the level is ALPHA / T (Bonferroni over the study's
trials), and one run is flagged only when it beats all of at least 20 T - 1 reference runs (99 for
the rulebook's 5 trials per study; 19 for one trial).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d500.competition import convergence
from d500.errors import ConfigError

SUFFIX = ".trials.json"  # not .yaml: the levels' folders hold one workload per *.yaml
IGNORED = ("optimizer", "native")  # not compared: the entry's code under test names its own


@dataclass(frozen=True)
class TrialReference:
    """The reference runs at one hyperparameter point of one workload on one backend."""

    entry: str
    backend: str
    command: str
    hyperparameters: dict[str, Any]  # as the reference runs recorded them
    params: dict[str, Any]  # the point asked for (a trial's parameters, or --at's)
    seeds: tuple[int, ...]
    samples: tuple[float, ...]
    metric: str = "epochs"

    @property
    def reference(self) -> convergence.Reference:
        """As convergence.check_epochs takes it."""
        return convergence.Reference(self.metric, self.entry, self.backend, self.command,
                                     self.samples, self.hyperparameters.get("batch_size"))

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "backend": self.backend, "metric": self.metric,
                "command": self.command, "params": self.params,
                "hyperparameters": self.hyperparameters, "seeds": list(self.seeds),
                "samples": list(self.samples)}


def path_of(workload_path: str | Path) -> Path:
    """The reference trials' file of a workload file: beside it."""
    p = Path(workload_path)
    return p.with_name(p.stem + SUFFIX)


def member_of(rel: str) -> str:
    """The same for a workload's path under the rules folder (2-training/digits-mlp.yaml)."""
    return str(path_of(rel))


def read(text: str | bytes, where: str | Path) -> list[TrialReference]:
    """Every entry of a reference trials' file, checked; a problem is a ConfigError naming the
    file and the entry."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: not JSON: {err}") from None
    entries = data.get("trials") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: expected an object with a list 'trials'")
    return [_entry(item, f"{where}: trials[{i}]") for i, item in enumerate(entries)]


def _entry(item: Any, where: str) -> TrialReference:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be an object")
    for key, kind in (("entry", str), ("backend", str), ("command", str), ("metric", str),
                      ("params", dict), ("hyperparameters", dict), ("seeds", list),
                      ("samples", list)):
        if not isinstance(item.get(key), kind):
            raise ConfigError(f"{where}: field '{key}' must be a {kind.__name__}")
    if item["metric"] not in convergence.METRICS:
        raise ConfigError(f"{where}: field 'metric' must be one of {convergence.METRICS}")
    samples = item["samples"]
    if len(samples) < convergence.MIN_SAMPLES:
        raise ConfigError(f"{where}: holds {len(samples)} run(s); a reference needs at least "
                          f"{convergence.MIN_SAMPLES}")
    for value in samples:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{where}: sample {value!r} is not a positive finite number")
    return TrialReference(item["entry"], item["backend"], item["command"],
                          dict(item["hyperparameters"]), dict(item["params"]),
                          tuple(int(s) for s in item["seeds"]),
                          tuple(float(v) for v in samples), item["metric"])


def load(path: str | Path) -> list[TrialReference]:
    """A file's entries; none when it does not exist."""
    p = Path(path)
    return read(p.read_bytes(), p) if p.is_file() else []


def matches(ref: TrialReference, backend: str, hyperparameters: Mapping[str, Any]) -> bool:
    """Whether a trial run (its backend and recorded hyperparameters) is at the reference's
    point (module docstring: same hyperparameters)."""
    if ref.backend != backend:
        return False
    return all(key in hyperparameters and _same(hyperparameters[key], value)
               for key, value in ref.hyperparameters.items() if key not in IGNORED)


def find(refs: Sequence[TrialReference], backend: str, hyperparameters: Mapping[str, Any]
         ) -> TrialReference | None:
    """The reference at a trial's point (the last recorded, if several are)."""
    found = [r for r in refs if matches(r, backend, hyperparameters)]
    return found[-1] if found else None


def write(path: str | Path, ref: TrialReference) -> None:
    """Put `ref` into the file (created if missing), replacing an entry at the same point and
    backend: one place per fact."""
    p = Path(path)
    kept = [r for r in load(p) if not (r.backend == ref.backend
                                       and _same_point(r.hyperparameters, ref.hyperparameters))]
    body = {"what": "d500 reference trials: reference runs at tuning trials' hyperparameters "
                    "(d500.competition.trial_reference)",
            "trials": [r.as_dict() for r in [*kept, ref]]}
    p.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    read(p.read_bytes(), p)  # it reads back


def of_measurement(m: Any, command: str) -> TrialReference:
    """A reference trials' entry from a d500.competition.reference.Measurement at a point;
    fewer succeeded runs than a reference needs is CheckFailed (reference.block's rule)."""
    from d500.errors import CheckFailed
    samples = m.samples
    if len(samples) < convergence.MIN_SAMPLES:
        raise CheckFailed(f"only {len(samples)} of {len(m.seeds)} reference runs at "
                          f"{m.params} reached the target (a reference needs "
                          f"{convergence.MIN_SAMPLES})")
    return TrialReference(m.entry.name, m.backend, command, m.recipe.hyperparameters_logged(),
                          dict(m.params), tuple(m.seeds), tuple(float(v) for v in samples),
                          m.metric)


def best_trial(trials: Mapping[int, Sequence[Any]], size: int, metric: str = "epochs"
               ) -> Any | None:
    """A study's best trial run: the succeeded attempt of a trial 0..size-1 with the fewest
    `metric` to target (the lower trial number on a tie); None when none succeeded."""
    done = [(r.figures.get(metric), n, r) for n, runs in trials.items() if 0 <= n < size
            for r in runs if r.status == "succeeded"]
    done = [d for d in done if isinstance(d[0], (int, float)) and math.isfinite(d[0])]
    return min(done, key=lambda d: (d[0], d[1]))[2] if done else None


def _same(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _same_point(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = (set(a) | set(b)) - set(IGNORED)
    return all(k in a and k in b and _same(a[k], b[k]) for k in keys)


def point(params: Mapping[str, Any] | None) -> str:
    """A point's parameters as one short text: lr=0.0512, momentum=0.9."""
    return ", ".join(f"{k}={_short(v)}" for k, v in sorted((params or {}).items())) \
        or "the reference entry's default recipe"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
