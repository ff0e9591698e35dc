"""Level 2 as a plug-in: training workloads in levels/2-training/, the `d500 train`, `d500 tune`
and `d500 data` commands, and `d500 run`'s small tuning study of the example entries on the
digits workloads with torch and TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from d500.levels import Command, Context, Item, Level, Outcome, RunOptions, View

DEFAULT = ("digits-mlp", "digits-lenet")  # `d500 run`
QUICK = ("digits-mlp",)
RUN_STUDIES, RUN_TRIALS = 1, 2  # `d500 run`: a small study per entry and backend
RUN_BACKENDS = ("torch", "tensorflow")


class TrainingLevel(Level):
    number, name, folder = 2, "training", "2-training"
    commands: ClassVar[dict[str, Command]] = {
        "train": Command("d500.training.cli", "level 2 (and 3): train a submission on a "
                                              "workload until its validation target"),
        "tune": Command("d500.training.tune_cli", "level 2: AlgoPerf-style tuning studies of "
                                                  "a submission on a workload"),
        "data": Command("d500.training.data_cli", "level 2: list and download the datasets"),
    }

    def load(self, path: str | Path) -> Any:
        from d500.training import workloads
        return workloads.load(path)

    def plan(self, options: RunOptions) -> list[Item]:
        """Each example entry on each default digits workload it enters, on torch and
        TensorFlow (or the backends asked for that can train): one small tuning study."""
        from d500 import backends
        from d500.training import submission as submissions
        names = list(options.workloads) or list(QUICK if options.quick else DEFAULT)
        known = {}
        for name in names:
            try:
                known[name] = self.load(self.find(name))
            except Exception:  # noqa: BLE001 - not a workload of this level: another level's
                if not options.workloads:
                    raise
        chosen = [b for b in (options.backends or RUN_BACKENDS)
                  if backends.is_installed(b) and not backends.hosted(b)  # (README: level 2)
                  and getattr(backends.get(b), "trainable", True)]
        items = []
        for folder in self.entries():
            entry = submissions.load(folder)
            for request, wl in known.items():
                if wl.name not in entry.workloads:
                    continue
                for backend in chosen:
                    items.append(Item(f"tune {entry.name} on {wl.name} ({backend})", [wl.name],
                                      payload=(wl, entry, backend), requested=[request]))
        return items

    def execute(self, item: Item, context: Context) -> Outcome:
        from d500.ledger.lifecycle import trial_label
        from d500.training.tuning import tune
        wl, entry, backend = item.payload
        report = tune(wl, entry, backend, studies=RUN_STUDIES, trials=RUN_TRIALS,
                      ledger=context.ledger, on_trial=lambda trial: _note(context, item, trial))
        outcome = Outcome(summary=f"{item.label}: " + ", ".join(
            f"{trial_label(t.study, t.number)} {r.status}" for t, r in report.ran))
        outcome.problems += [f"{item.label}, {trial_label(t.study, t.number)}: {r.error}"
                             for t, r in report.ran if r.status == "failed"]
        return outcome

    def views(self, boards: Sequence[Any], ledger: Any) -> list[View]:
        from d500.training import views
        return views.views(self.number, boards, ledger)


def _note(context: Context, item: Item, trial: Any) -> Any:
    from d500.ledger.lifecycle import trial_label
    name = trial_label(trial.study, trial.number)

    def progress(state: dict[str, Any]) -> None:
        if state["step"] % 20 == 0:
            context.note(f"{item.label}, {name}: step {state['step']}, "
                         f"loss {state['loss']:.3f}")
    return progress


LEVEL = TrainingLevel()
