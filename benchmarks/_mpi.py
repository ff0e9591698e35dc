"""The MPI benchmarks' start: run plainly, a benchmark replaces itself with the same command under
the venv's MPICH (`mpiexec -n RANKS`); under a launcher it goes on with its parsed arguments."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from d500.distributed.launch import launched_by_mpi


def parse_under_mpiexec(parser: argparse.ArgumentParser, argv: list[str] | None,
                        script: str) -> argparse.Namespace:
    """`parser`'s arguments, with --ranks added (how many ranks mpiexec starts). Outside an MPI
    launcher this does not return: the process becomes `mpiexec -n RANKS python script ...`
    with the same arguments."""
    parser.add_argument("--ranks", type=int, default=2, help="ranks when it starts mpiexec")
    args = parser.parse_args(argv)
    if not launched_by_mpi():
        mpiexec = Path(sys.executable).with_name("mpiexec")
        os.execv(mpiexec, [str(mpiexec), "-n", str(args.ranks), sys.executable,
                           os.path.abspath(script), *(argv or sys.argv[1:])])
    return args
