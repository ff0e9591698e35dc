"""Level 3 as a plug-in: distributed-training workloads in levels/3-distributed/ (run by
`mpiexec -n N d500 train`), the `d500 scale` command (the alpha-beta scaling model), and
`d500 run`'s level-3 stage: `mpiexec -n 2` started from the venv's MPICH for a small set of
entries on digits-mlp, every run recorded by the child processes' rank 0 into the same ledger."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from d500.levels import Command, Context, Item, Level, Outcome, RunOptions, View

DEFAULT = ("digits-mlp",)  # `d500 run`
RUN_RANKS = 2
RUN_ENTRIES = ("sync", "sync-powersgd", "ddp-baseline")  # `d500 run` (--quick: the first two)
RUN_BACKEND = "torch"
RUN_TIMEOUT = 600.0  # seconds for one mpiexec of `d500 run`


class DistributedLevel(Level):
    number, name, folder = 3, "distributed", "3-distributed"
    commands: ClassVar[dict[str, Command]] = {
        "scale": Command("d500.distributed.scale_cli", "level 3: predict step time and scaling "
                                                       "efficiency at 8 to 1,024 ranks (alpha-beta "
                                                       "model) from a run or a workload"),
    }

    def load(self, path: str | Path) -> Any:
        from d500.distributed import workloads
        return workloads.load(path)

    def plan(self, options: RunOptions) -> list[Item]:
        """The chosen entries on digits-mlp at 2 ranks (torch), one mpiexec each."""
        from d500.training import submission as submissions
        names = list(options.workloads) or list(DEFAULT)
        known = {}
        for name in names:
            try:
                known[name] = self.load(self.find(name))
            except Exception:  # not a workload of this level: another level's
                if not options.workloads:
                    raise
        if options.backends is not None and RUN_BACKEND not in options.backends:
            return []
        wanted = RUN_ENTRIES[:2] if options.quick else RUN_ENTRIES
        items = []
        for folder in self.entries():
            entry = submissions.load(folder)
            if folder.name not in wanted and entry.name not in wanted:
                continue
            for request, wl in known.items():
                if wl.name in entry.workloads and RUN_RANKS in wl.ranks:
                    items.append(Item(f"{entry.name} on {wl.name} at {RUN_RANKS} ranks",
                                      [wl.name], payload=(wl, folder), requested=[request]))
        return items

    def execute(self, item: Item, context: Context) -> Outcome:
        from d500.distributed.launcher import launch_train
        wl, folder = item.payload
        report = launch_train(wl.path, folder, RUN_RANKS, backend=RUN_BACKEND,
                              extra=["--seeds", "1"],  # the first required seed, as before
                              timeout=RUN_TIMEOUT, log=context.log)
        outcome = Outcome(summary=f"{item.label}: {report.summary}")
        if report.problem:
            outcome.problems.append(f"{item.label}: {report.problem}")
        return outcome

    def views(self, boards: Sequence[Any], ledger: Any) -> list[View]:
        from d500.distributed import views
        return views.views(self.number, boards, ledger)


LEVEL = DistributedLevel()
