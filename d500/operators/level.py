"""Level 0 as a plug-in: operator cases in levels/0-operators/, the `d500 op` command, and
`d500 run`'s benchmark of the example operator entries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from d500.levels import Command, Context, Item, Level, Outcome, RunOptions, View


class OperatorsLevel(Level):
    number, name, folder, noun = 0, "operators", "0-operators", "case"
    commands: ClassVar[dict[str, Command]] = {"op": Command("d500.operators.cli",
                              "level 0: validate and benchmark a custom operator")}

    def load(self, path: str | Path) -> Any:
        from d500.operators.workloads import load_case
        return load_case(path)

    def plan(self, options: RunOptions) -> list[Item]:
        """Each example entry on each case it enters (only the wanted cases, if any)."""
        from d500.operators.base import load
        from d500.operators.workloads import cases_for
        items = []
        for folder in self.entries():
            loaded = load(str(folder), isolated=True)
            for case in cases_for(loaded.cls.op_type, loaded.workloads):
                if options.workloads and case.name not in options.workloads:
                    continue
                items.append(Item(f"{folder.name} on {case.name}", [case.name],
                                  payload=(folder, case.path), requested=[case.name]))
        return items

    def execute(self, item: Item, context: Context) -> Outcome:
        from d500.operators.base import load, source_path
        from d500.operators.compile import build
        from d500.operators.run import bench_cases, default_backends
        from d500.operators.validate import Options
        from d500.operators.workloads import load_case

        folder, case_path = item.payload
        loaded = load(str(folder), isolated=True)
        if loaded.cls.framework == "c":
            build(source_path(loaded.cls))
        names = context.options.backends or default_backends()
        outcome = Outcome()
        for result in bench_cases(loaded, [load_case(case_path)], names, Options(),
                                  context.options.budget, ledger=context.ledger):
            context.log(result.text())
            if result.operator_failed:
                outcome.problems.append(f"level 0 {folder.name} on {result.case.name}: "
                                        f"{result.rows[0].error}")
            outcome.summary = f"{folder.name} on {result.case.name}: " + ", ".join(
                f"{r.backend} {r.status}" for r in result.rows)
        return outcome

    def views(self, boards: Sequence[Any], ledger: Any) -> list[View]:
        """The organiser's summary over the cases: one row per submission x backend."""
        from d500.leaderboard import summary
        from d500.operators.bench import BUILTIN
        return summary.views(boards, ledger, by_submission=True, builtin=BUILTIN)


LEVEL = OperatorsLevel()
