"""Level 1 as a plug-in: network workloads in levels/1-networks/, the `d500 net` command, and
`d500 run`'s check and benchmark of a few networks on every installed backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from d500.errors import ConfigError
from d500.levels import Command, Context, Item, Level, Outcome, RunOptions, View

DEFAULT = ("light-squeezenet", "light-resnet50", "resnet20-cifar")  # `d500 run`
QUICK = ("mlp-mnist",)  # `d500 run --quick`


class NetworksLevel(Level):
    number, name, folder = 1, "networks", "1-networks"
    commands: ClassVar[dict[str, Command]] = {"net": Command("d500.networks.cli",
                               "level 1: check and benchmark ONNX networks across backends")}

    def load(self, path: str | Path) -> Any:
        from d500.networks import workloads
        return workloads.load(path)

    def plan(self, options: RunOptions) -> list[Item]:
        """`net check` of each workload's model on every backend, then `net bench` of each."""
        from d500.workload import read_yaml
        if options.workloads:
            chosen = []
            for wanted in options.workloads:
                try:
                    path = self.find(wanted)
                except ConfigError:  # not a level-1 workload: another level's, or unknown
                    continue
                _, data = read_yaml(path)
                if isinstance(data, dict) and data.get("level") == self.number:
                    chosen.append((wanted, path))
        else:
            chosen = [(None, self.find(n)) for n in (QUICK if options.quick else DEFAULT)]
        loaded = [(wanted, self.load(path)) for wanted, path in chosen]  # validate now
        checks = [Item(f"net check {wl.name}", [f"check:{wl.name}"], payload=("check", wl),
                       requested=[wanted] if wanted else []) for wanted, wl in loaded]
        benches = [Item(f"net bench {wl.name}", [wl.name], payload=("bench", wl),
                        requested=[wanted] if wanted else []) for wanted, wl in loaded]
        return checks + benches

    def execute(self, item: Item, context: Context) -> Outcome:
        from d500 import backends
        kind, wl = item.payload
        names = context.options.backends or backends.installed()
        if kind == "check":
            return _check(wl, names, context)
        return _bench(wl, names, context)

    def views(self, boards: Sequence[Any], ledger: Any) -> list[View]:
        """The organiser's summary over the networks: one row per backend; then each framework
        at its best mode, with compile time (d500.leaderboard.modes)."""
        from d500.leaderboard import modes, summary
        best = modes.view(boards)
        return summary.views(boards, ledger, by_submission=False) + ([best] if best else [])


def _check(wl: Any, names: list[str], context: Context) -> Outcome:
    from d500.networks import inputs
    from d500.networks.check import Recorder, check

    model, path = wl.onnx_model(loss=wl.train)
    feeds = inputs.make(model, wl.seed)
    report = check(model, feeds, names, model_name=wl.name, seed=wl.seed,
                   progress=lambda b: context.note(f"{wl.name} on {b}" if b else ""),
                   recorder=Recorder(path, context.ledger, workload=f"check:{wl.name}"))
    outcome = Outcome(summary=f"net check {wl.name}: " + ", ".join(
        f"{r.backend} {r.verdict}" for r in report.results if r.backend != report.baseline)
        + f" (baseline {report.baseline})")
    if report.exit_code != 0:
        outcome.problems.append(f"net check {wl.name}: " + "; ".join(
            f"{r.backend}: {r.verdict} {r.error}".strip() for r in report.results
            if not r.agrees and r.backend != report.baseline))
    return outcome


def _bench(wl: Any, names: list[str], context: Context) -> Outcome:
    from d500.networks.bench import bench

    result = bench(wl, names, ledger=context.ledger, budget=context.options.budget,
                   progress=lambda text: context.note(text.split(": ", 1)[-1] if text else ""))
    outcome = Outcome(summary=f"net bench {wl.name}: " + ", ".join(
        f"{r.backend} {r.status}" for r in result.results))
    outcome.problems += [f"net bench {wl.name} on {r.backend}: {r.error}"
                         for r in result.results if r.status != "succeeded"]
    return outcome


LEVEL = NetworksLevel()
