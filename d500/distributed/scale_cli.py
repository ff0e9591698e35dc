"""`d500 scale RUN_ID|WORKLOAD [--network 2us,12.5GB/s]`: the alpha-beta model's predicted step
time, communication share and scaling efficiency at 8 ... 1,024 ranks for each scheme and
compressor (d500.distributed.scaling), as a table and a PNG plot; a pipeline's (tensor inside
its stages too) bubble and memory per rank in a second table, a sharded (ZeRO) run's memory per
rank in a third.

RUN_ID models that level-3 run; a WORKLOAD name (or file) models the newest succeeded run at 2 or
more ranks of every (entry, scheme, compressor) recorded on it. The network is `--network
LATENCY,BANDWIDTH` (a cluster's), or measured on this machine by a ping-pong sweep between two
MPI ranks (under `mpiexec -n 2 d500 scale ...`, or started here from the venv's MPICH).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser
from d500.errors import UsageError
from d500.paths import non_empty


def main(argv: list[str], prog: str = "d500 scale") -> int:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="a level-3 run id, or a level-3 workload name or file")
    p.add_argument("--network", metavar="LATENCY,BANDWIDTH",
                   help="e.g. 2us,12.5GB/s (default: measured on this machine)")
    p.add_argument("--ranks", default=None, metavar="N,N,...",
                   help="world sizes to predict (default 8,16,...,1024)")
    p.add_argument("--weak", action="store_true",
                   help="keep the per-rank batch (weak scaling) instead of the global batch")
    p.add_argument("--png", metavar="FILE", type=non_empty("a file name"),
                   help="write the plot here (default: "
                                                 "$D500_HOME/scale-<target>.png, with --weak "
                                                 "scale-<target>-weak.png)")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument("--ledger", metavar="FILE", type=non_empty("a ledger file"),
                   help="a ledger file other than "
                   "$D500_HOME/ledger.sqlite")
    args = p.parse_args(argv)
    args.prog = prog
    from d500.distributed import launch
    sizes = _sizes(args.ranks)
    target = _target(args.target)
    if args.png:
        from d500.paths import output_file
        output_file(args.png, "scale.png", option="--png", endings=(".png",))
    from d500.ledger.store import absent
    if why := absent(args.ledger):  # said on every rank, before the network's 15 s sweep
        raise UsageError(why)
    world = launch.world()
    given = _network(args, None) if args.network else None  # a bad --network before anything
    if world is not None and given is None:
        given = _network(args, world)  # every rank takes part in the measurement first
    if world is not None and world.Get_rank() != 0:
        return 0  # rank 0 prints
    from d500.distributed import scaling
    from d500.ledger import Ledger
    with Ledger.open_for_reading(args.ledger) as ledger:
        profiles = _profiles(ledger, target, named=target == args.target)
    net = given or _network(args, None)
    rows = scaling.predict(profiles, net, sizes, weak=args.weak)
    from d500.paths import home, write_output
    png_path = write_output(Path(args.png) if args.png else home() / (
        f"scale-{_slug(target)}{'-weak' if args.weak else ''}.png"),
        scaling.plot(rows, net, weak=args.weak))
    if args.json:
        print(json.dumps({"network": {"alpha": net.alpha, "beta": net.beta, "spec": net.spec(),
                                      "source": net.source},
                          "png": str(png_path),
                          "profiles": [_profile_json(pr) for pr in profiles],
                          "predictions": [{"label": r.profile.label, "ranks": r.ranks,
                                           "step_time": r.step, "comm_time": r.comm,
                                           "comm_share": r.comm_share,
                                           "scaling_efficiency": r.efficiency,
                                           "bubble": r.bubble, "memory_per_rank": r.memory,
                                           "not_possible": r.reason} for r in rows]},
                         indent=1))
        return 0
    _print(profiles, rows, net, png_path, args.weak)
    return 0


def _sizes(text: str | None) -> tuple[int, ...]:
    from d500.distributed.scaling import SIZES
    if text is None:
        return SIZES
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"--ranks {text!r}: expected world sizes >= 1 such as 8,64,512")
    return sizes


def _target(text: str) -> str:
    """A run id or workload name as given, or the `name:` of a level-3 workload file (a file of
    another level, a missing one, is a ConfigError naming it)."""
    if not text.strip():  # Path('') is '.', which said '.: a folder, where a YAML file is'
        raise UsageError("the target is empty: give a level-3 run's id or a level-3 workload")
    path = Path(text)
    if text.isdigit() or (path.suffix not in (".yaml", ".yml") and not path.is_file()):
        return text  # a name, even where the current folder holds a folder of that name
    from d500 import levels
    return levels.of_file(path, takes=(3,)).load(path).name


def _profiles(ledger: Any, target: str, named: bool = False) -> list[Any]:
    """The run `target` (an id), or the newest succeeded run at >= 2 ranks of every (entry,
    scheme, compressor) of the level-3 workload `target` (`named`: given by name, not by its
    file, so a name the rulebook lacks is said so). By name, a run imported with --force past
    `d500 check` is never the one modelled, and a `d500 reproduce` run only where its entry has
    no run of its own: the board's rules (ranking.origin)."""
    from d500.distributed.scaling import Profile
    from d500.leaderboard.ranking import origin
    if target.isdigit():
        return [Profile.from_run(ledger.get(int(target)))]
    newest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in ledger.runs(level=3, workload=target, status="succeeded"):
        if (r["world_size"] or 1) < 2 or not (r["details"] or {}).get("ranks"):
            continue
        source = origin(r) or {}
        if source.get("forced"):
            continue
        h = r["hyperparameters"]
        key = (r["submission"], h.get("scheme", "?"), h.get("compressor", "none"))
        if not source.get("reproduction") or key not in newest or (
                origin(newest[key]) or {}).get("reproduction"):
            newest[key] = r
    if not newest:
        if named and not ledger.runs(level=3, workload=target):
            from d500 import levels
            levels.get(3).find(target)  # no level-3 workload has it: said, with the closest
        raise UsageError(f"no succeeded level-3 run of '{target}' at 2 or more ranks in the "
                         f"ledger: run `mpiexec -n 2 d500 train ...` first, or give a run id")
    return [Profile.from_run(r) for r in newest.values()]


def _network(args: Any, world: Any) -> Any:
    """--network, or a ping-pong sweep (the MPI ranks of this command, or a 2-rank mpiexec
    started here)."""
    from d500.distributed import network
    if args.network:
        return network.parse_network(args.network)
    if world is None or world.Get_rank() == 0:  # ~15 s at load 12, said nothing meanwhile
        from d500.say import say
        say(f"{args.prog}: measuring this machine's network (a ping-pong sweep between 2 MPI "
            f"ranks; --network LATENCY,BANDWIDTH gives a cluster's instead) ...")
    if world is not None:
        from d500.distributed.comm import Communicator
        return network.measure(Communicator(world))
    return measure_here()


def measure_here() -> Any:
    """alpha and beta of this machine's MPI, measured by `mpiexec -n 2` of the ping-pong sweep
    (the venv's MPICH)."""
    from d500.distributed import network
    from d500.distributed.launcher import mpiexec
    launcher = mpiexec()
    if launcher is None:
        raise UsageError(f"no mpiexec beside {sys.executable} to measure the network: give "
                         f"--network LATENCY,BANDWIDTH")
    code = ("from d500.distributed import comm, network\n"
            "c = comm.Communicator.for_world()\n"
            "n = network.measure(c)\n"
            "import json\n"
            "print(json.dumps([n.alpha, n.beta])) if c.rank == 0 else None\n")
    out = subprocess.run([str(launcher), "-n", "2", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=300, check=False)
    try:
        alpha, beta = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError, TypeError):
        raise UsageError(f"measuring the network failed: {out.stderr.strip()[-300:]}") from None
    return network.Network(float(alpha), float(beta), "ping-pong")


def _profile_json(p: Any) -> dict[str, Any]:
    return {"label": p.label, "run_id": p.run_id, "ranks": p.ranks, "compute_time": p.compute,
            "step_time": p.step, "global_batch": p.global_batch, "batch_mode": p.batch_mode,
            "tensor": p.tensor, "memory_per_rank": p.memory, "pipeline": p.pipeline,
            "micro_batches": p.micro, "schedule": p.schedule, "crossing_bytes_per_sample":
            p.crossing, "stash_bytes_peak": p.activation,
            "collectives": [{"name": c.name, "calls": c.calls, "bytes": c.nbytes}
                            for c in p.collectives]}


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)


def _print(profiles: list[Any], rows: list[Any], net: Any, png: Path, weak: bool) -> None:
    from rich.table import Table

    from d500.cli import stdout_console
    from d500.distributed import scaling
    from d500.metrics import format_duration
    out = stdout_console()
    out.print(f"network: alpha {net.alpha * 1e6:.3g} us, bandwidth {net.bandwidth / 1e9:.3g} GB/s "
              f"({net.source})", highlight=False, soft_wrap=True)
    for p in profiles:
        coll = ", ".join(f"{c.name} {c.calls:g}x{c.nbytes:,.0f} B" for c in p.collectives)
        held = "" if p.memory is None else f"; {p.memory:,.0f} B held per rank at any size" \
            if p.tensor > 1 and p.pipeline == 1 else f"; {p.memory:,.0f} B held per rank"
        if p.pipeline > 1:
            held += (f"; {p.crossing:,.0f} B/sample cross the costliest cut, " +
                     (f"stash peak {p.activation:,.0f} B" if p.activation else
                      "stash not measured"))
        out.print(f"{p.label} (run {p.run_id}, measured at {p.ranks} ranks): compute "
                  f"{format_duration(p.compute)}/step, step {format_duration(p.step)}; {coll}"
                  f"{held}", highlight=False, soft_wrap=True)
    sizes = list(dict.fromkeys(r.ranks for r in rows))
    kind = "weak scaling: per-rank batch kept" if weak else "strong scaling: global batch kept"
    table = Table(title=f"predicted step time / communication share / scaling efficiency "
                        f"({kind})")
    table.add_column("scheme / compressor")
    for n in sizes:
        table.add_column(f"{n} ranks", justify="right")
    for p in profiles:
        cells = []
        for n in sizes:
            r = next(r for r in rows if r.profile is p and r.ranks == n)
            cells.append("—" if r.step is None else
                         f"{format_duration(r.step)} / {r.comm_share:.2f} / {r.efficiency:.2f}")
        table.add_row(p.label, *cells)
    out.print(table)
    _per_size(out, "pipelines (tensor inside their stages too): predicted bubble / memory per "
              "rank (the stage's states, or a tensor rank's shard of them, + stashed micro-batch "
              "inputs)", [p for p in profiles if p.pipeline > 1], sizes, rows,
              lambda r: "—" if r.bubble is None else f"{r.bubble:.2f} / {r.memory:,.0f} B")
    _per_size(out, "sharded (ZeRO): predicted memory per rank (whole states + the sharded ones "
              "cut N ways)", [p for p in profiles if p.shard != "none"], sizes, rows,
              lambda r: f"{r.memory:,.0f} B")
    for line in scaling.left_out(rows):
        out.print(f"—  {line}", highlight=False, soft_wrap=True)  # whole in a log or a pipe,
    out.print(f"plot: {png}", highlight=False, soft_wrap=True)  # as a table is not


def _per_size(out: Any, title: str, profiles: list[Any], sizes: list[int], rows: list[Any],
              cell: Any) -> None:
    """A table of `profiles` by world size, each cell `cell(prediction)`; none when empty."""
    if not profiles:
        return
    from rich.table import Table
    table = Table(title=title)
    table.add_column("scheme")
    for n in sizes:
        table.add_column(f"{n} ranks", justify="right")
    for p in profiles:
        table.add_row(p.label, *(next(cell(r) for r in rows if r.profile is p and r.ranks == n)
                                 for n in sizes))
    out.print(table)
