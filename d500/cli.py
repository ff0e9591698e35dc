"""The `d500` command: dispatches to one module per subcommand, imported only when it is used."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
from typing import Any

# Before NumPy loads: OpenBLAS's idle workers otherwise busy-wait ~2^28 cycles after each call,
# stealing the cores of whichever backend d500 times next in an interleaved measurement (seen:
# torch's ResNet-50 latency doubled beside the NumPy reference). A user's own setting wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from d500 import __version__  # noqa: E402
from d500.errors import D500Error, UsageError  # noqa: E402
from d500.say import say  # noqa: E402


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors become a one-line UsageError (exit 2) instead of a usage dump,
    with the closest option or choice to a mistyped one."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(_with_hint(self, message))


def _with_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's message, plus "did you mean '--backend'?" for an unrecognized option (among
    every option of the parser and its subcommands) or an invalid choice; a mistyped option is
    said before the required one it left missing (`--submision X`: not '--submission required')."""
    from d500.errors import did_you_mean
    unknown = [a for a in getattr(parser, "_given", []) if a.startswith("--") and not any(
        o.startswith(a.split("=")[0]) for o in _options(parser))]  # argparse takes prefixes
    if message.startswith("the following arguments are required") and unknown:
        message = f"unrecognized arguments: {' '.join(unknown)}"
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
        hint = did_you_mean(choice[1], re.findall(r"'([^']*)'", choice[2]))
    elif message.startswith("unrecognized arguments: "):
        given = [a.split("=")[0] for a in message.split(": ", 1)[1].split()]
        options = _options(parser)  # another subcommand's own option is no typo: no hint
        named = _options(parser, getattr(parser, "_given", []))
        hint = next(filter(None, (_synonym(arg, named) for arg in given)), "")
        hint = hint or next(filter(None, (_closest_option(arg, options) for arg in given
                                          if arg.startswith("--") and arg not in options)), "")
        hint = hint or _before_command(parser, given, getattr(parser, "_given", []))
        positionals = _positionals(parser, getattr(parser, "_given", []))
        name = next((a[2:] for a in given if a[2:] in positionals), None)
        if name and not hint:  # `train --workload W`: W is given as it is, first
            hint = (f"the {name} goes without '--{name}': {positionals[name]} "
                    f"{name.upper()} ...")
    else:
        hint = _subcommands(parser, message)
    return f"{message} ({hint})" if hint else message


def _before_command(parser: argparse.ArgumentParser, unknown: list[str], given: list[str]
                    ) -> str:
    """Where an option of `parser` itself came after its subcommand, which does not take it
    (`d500 ledger import P --ledger F`): that it goes before the subcommand."""
    own = {o: a for a in parser._actions for o in a.option_strings if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            command = next((a for a in given if a in action.choices), None)
            misplaced = next((a for a in unknown if a in own), None)
            if command and misplaced:
                value = "" if own[misplaced].nargs == 0 else \
                    f" {own[misplaced].metavar or own[misplaced].dest.upper()}"
                return (f"{misplaced} goes before the command: {parser.prog} "
                        f"{misplaced}{value} {command} ...")
    return ""


def _subcommands(parser: argparse.ArgumentParser, message: str) -> str:
    """"one of list, show, ..." where `message` says a parser's subcommand is missing."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and message.startswith(
                "the following arguments are required") and (
                argparse._get_action_name(action) or "") in message:
            return f"one of {', '.join(action.choices)}"
    return ""


def _closest_option(arg: str, options: list[str]) -> str:
    """did_you_mean among the long options, judged on the names after their '--' (the dashes
    they all share made '--model' look near '--rtol')."""
    from d500.errors import did_you_mean
    return did_you_mean(arg.lstrip("-"), [o[2:] for o in options]).replace("'", "'--", 1)


# Options a person reaches for -> what d500 calls them, by command (the first the command
# takes): `d500 check P --key K.pub` was told only 'unrecognized arguments'
SYNONYMS = {"key": ("trust", "sign"), "pubkey": ("trust",), "public-key": ("trust",),
            "private-key": ("sign",), "signing-key": ("sign",)}


def _synonym(arg: str, options: list[str]) -> str:
    """"did you mean '--trust'?" where `arg` names by another word an option of `options`."""
    for name in SYNONYMS.get(arg.split("=")[0].lstrip("-"), ()) if arg.startswith("--") else ():
        if f"--{name}" in options:
            return f"did you mean '--{name}'?"
    return ""


def _positionals(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, str]:
    """name -> prog of the positional arguments (`workload`, `model`) of the parser and of the
    subcommand named in `given`."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in given:
                    found.update(_positionals(sub, given))
        elif not action.option_strings:
            found.setdefault(action.dest, parser.prog)
    return found


def _options(parser: argparse.ArgumentParser, given: list[str] | None = None) -> list[str]:
    """Every long option of `parser` and of its subcommands' parsers (`given`: of those named
    there only, nested)."""
    found = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if given is None or name in given:
                    found += _options(sub, given)
    return found


def stdout_console(**options: Any) -> Any:
    """A rich Console on stdout; wide when stdout is not a terminal (logs, pipes), so tables
    are not squeezed to 80 columns, and there a table wider still is printed whole at its own
    width (folded at 160, `d500 reproduce ... | cat` cut its verdict mid-word). A reader that
    goes away (`| head`) raises BrokenPipeError, which `main` ends quietly with exit 0 (rich's
    own answer is exit 1, a failed check's code)."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

        def print(self, *objects: Any, **kwargs: Any) -> None:
            from rich.measure import Measurement
            from rich.table import Table
            was = self.width
            if not self.is_terminal:  # a table's natural width, however wide (a pipe, a log)
                wide = self.options.update_width(1 << 16)
                self.width = max([was, *(Measurement.get(self, wide, o).maximum
                                         for o in objects if isinstance(o, Table))])
            try:
                super().print(*objects, **kwargs)
            finally:
                self.width = was

    return StdoutConsole(width=None if sys.stdout.isatty() else 160, **options)


def seconds(text: str) -> float:
    """argparse type of a time budget: a positive, finite number of seconds, at most LONGEST."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    if value > LONGEST:  # --budget 1e9 was taken: each of a run's measurements, for 31 years
        raise argparse.ArgumentTypeError(f"expected at most {LONGEST:,} seconds (an hour), "
                                         f"got {text!r}")
    return value


LONGEST = 3600  # s of a time budget `seconds` takes: one measurement's, never a day's


def count(text: str) -> int:
    """argparse type of a number of things to run (studies, trials, seeds, runs): an integer >= 1,
    refused as the command line is read, before anything slow starts."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    if int(text) > MOST:  # tune --trials 10**9 died drawing them all (7.45 GiB, a traceback)
        raise argparse.ArgumentTypeError(f"expected at most {MOST:,}, got {text!r}")
    return int(text)


MOST = 10 ** 6  # of anything `count` counts: a million trials of even digits-mlp take weeks


def processes(text: str) -> int:
    """argparse type of a number of worker processes (`conformance --jobs`): a `count` of at most
    threads.OVERSUBSCRIBED x the usable cores (--jobs 10000 started a process, each importing
    its framework, for every test at once)."""
    from d500 import provenance
    from d500.threads import OVERSUBSCRIBED
    n, cores = count(text), provenance.usable_cores()
    if n > OVERSUBSCRIBED * cores:
        raise argparse.ArgumentTypeError(
            f"expected at most {OVERSUBSCRIBED * cores} processes ({OVERSUBSCRIBED}x the {cores} "
            f"cores this process may use), got {text!r}")
    return n


def seed(text: str) -> int:
    """argparse type of a random seed: an integer >= 0 (NumPy's generators take no other) that
    the ledger's SQLite integer holds (below 2**63)."""
    if not text.strip().isdecimal() or int(text) >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 and below 2**63, got {text!r}")
    return int(text)


def run_id(text: str) -> int:
    """argparse type of a ledger run's id (`train --resume RUN`): an integer >= 1."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a run id (an integer >= 1, as `d500 ledger "
                                         f"list` shows them), got {text!r}")
    return int(text)


# The commands whose ranks work together under mpiexec -n K; any other ran K times over, side by
# side (mpiexec -n 2 d500 net bench recorded two benchmarks, each timed beside the other).
UNDER_MPI = ("train", "tune", "scale", "benchmark")  # benchmark: a script that takes it

# name -> (module with `main(argv, prog) -> int`, one-line help); each registered level adds its
# own (d500.levels). Modules are imported lazily so `d500 --help` never imports a framework.
CORE: dict[str, tuple[str, str]] = {
    "run": ("d500.runner", "the main job: a quick suite over every level, then the leaderboard"),
    "conformance": ("d500.conformance", "run the ONNX backend node test suite against a backend"),
    "backends": ("d500.backends.cli", "list the installed backends"),
    "ledger": ("d500.ledger_cli", "list, show, export and verify recorded runs; import packages"),
    "leaderboard": ("d500.leaderboard", "rank recorded runs by the metric definitions"),
    "package": ("d500.competition.package_cli", "pack an entry's runs into one file to submit"),
    "keygen": ("d500.competition.keygen_cli", "make an ed25519 key to sign packages with"),
    "check": ("d500.competition.check_cli", "check a package: complete, by the rules, intact"),
    "reference": ("d500.competition.reference_cli", "measure a workload's reference convergence"),
    "reproduce": ("d500.competition.reproduce_cli", "re-run chosen runs of a package, compare"),
    "benchmark": ("d500.benchmark_cli", "list or run the checkout's side-by-side speed benchmarks"),
}


def commands() -> dict[str, tuple[str, str]]:
    """Every subcommand: the core ones, then each registered level's in level order."""
    from d500.levels import all_levels
    found = dict(CORE)
    for level in all_levels():
        for name, command in level.commands.items():
            if name in found and found[name][0] != command.module:
                raise D500Error(f"{level.title} adds the command '{name}', which "
                                f"{found[name][0]} already provides")
            found[name] = (command.module, command.help)
    return found

USAGE = """usage: d500 [--debug] [--version] COMMAND [ARGS...]

d500 measures a deep-learning stack at four levels (operators, networks, training,
distributed) under fixed rules and records every run in a ledger.

commands:
{commands}

options:
  --debug     show tracebacks for errors
  --version   print the version and exit

Run `d500 COMMAND --help` for a command's options."""


def _usage(table: dict[str, tuple[str, str]]) -> str:
    width = max(len(name) for name in table)
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in table.items()]
    return USAGE.format(commands="\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """d500's entry point; output cut short by its reader (`d500 ... | head`) ends quietly, and
    a character the terminal's encoding lacks (LANG=C, PYTHONIOENCODING=ascii: the tables'
    '×', '…', 'µ') prints as '?' instead of ending the command in a traceback."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away: no traceback, and none at exit's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # a ^C before the command's own handler (a level's import in
        # `commands()`): one line, and under mpiexec the job's end (_end_mpi_job), not a
        # traceback, and a peer left waiting in MPI_Init for good
        given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--debug"]
        name = "d500" + (f" {given[0]}" if given and not given[0].startswith("-") else "")
        _end_mpi_job(f"{name}: interrupted", 130)
        say(f"{name}: interrupted")
        return 130


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("D500_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    from d500.distributed.launch import launcher_rank
    if argv[:1] == ["train"] and launcher_rank() is not None:  # each rank goes to MPI_Init,
        from d500.distributed.launch import will_join  # where the others wait for it: from
        will_join()  # here a ^C takes it there, to end the job (_end_mpi_job)
    table = commands()
    if not argv or argv[0] in ("-h", "--help") or argv == ["help"]:
        print(_usage(table))
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"d500 {__version__}")
        return 0
    if argv[0] == "help" and argv[1].startswith("-"):  # `d500 help --help`: d500's own
        print(_usage(table))
        return 0
    if argv[0] == "help":  # `d500 help train`, `d500 help ledger list`: that command's help
        argv = [*argv[1:], "--help"]
    name, rest = argv[0], argv[1:]
    if name.startswith("-"):
        from d500.errors import did_you_mean
        hint = did_you_mean(name, ["--debug", "--version", "--help"])
        say(f"d500: error: unknown option '{name}' (before a command d500 takes --debug, "
            f"--version or --help{'; ' + hint if hint else ''})")
        return 2
    if name not in table:
        from d500.errors import did_you_mean
        hint = did_you_mean(name, table)
        say(f"d500: error: unknown command '{name}' (choose from {', '.join(table)}"
            f"{'; ' + hint if hint else ''})")
        return 2
    try:
        os.getcwd()
    except FileNotFoundError:  # every relative path (./d500-results, a workload) failed in a
        say(f"d500 {name}: error: the current folder no longer exists (removed since the "
            f"shell entered it): cd into a folder that does")  # traceback from the first one
        return 2
    if name not in UNDER_MPI and launcher_rank() is not None:
        say(f"d500 {name}: error: it runs in one process, and under mpiexec every rank would "
            f"run it again beside the others (drop mpiexec; it is for d500 "
            f"{', '.join(UNDER_MPI[:-1])} and {UNDER_MPI[-1]})")
        return 2
    from d500.backends import quiet_frameworks
    quiet_frameworks()  # before any command imports a framework, or a user's file does
    try:
        module = importlib.import_module(table[name][0])
        return int(module.main(rest, prog=f"d500 {name}") or 0)
    except D500Error as err:
        if debug:  # the traceback, then the same line and exit code (it exited 1, a failed
            import traceback  # check's code, for a usage error)
            traceback.print_exc()
        say(f"d500 {name}: error: {err}")
        return err.exit_code
    except KeyboardInterrupt:
        _end_mpi_job(f"d500 {name}: interrupted", 130)
        say(f"d500 {name}: interrupted")
        return 130


def _end_mpi_job(line: str, code: int) -> None:
    """Under mpiexec, a rank stopped by Ctrl-C ends the whole job (MPI_Abort, after `line`):
    returning, it waited in MPI_Finalize for a rank blocked in MPI that no signal reaches, and
    mpiexec and both ranks hung, that rank spinning a core. A rank on its way to MPI_Init
    (d500.distributed.launch.joins) goes there first. Nothing where MPI never starts."""
    mpi = sys.modules.get("mpi4py.MPI")
    from d500.distributed.launch import joins
    if mpi is None and joins():  # on its way to MPI_Init, where its peers wait for it: there
        try:
            from mpi4py import MPI as mpi
        except KeyboardInterrupt:  # a second ^C: mpiexec's own, which ends the job
            return
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or \
            mpi.COMM_WORLD.Get_size() < 2:
        return
    from d500.distributed.faults import end_job
    end_job(mpi.COMM_WORLD, line, code)


if __name__ == "__main__":
    sys.exit(main())
