"""d500's Communicator.allreduce against raw mpi4py Allreduce on the same buffers, interleaved.

Both sides sum the same float32 buffer of 4, 16 and 64 MB in place over 2 ranks: d500 through
`Communicator.allreduce` (MPI_Allreduce plus its byte counting and timing), the native side as
`comm.Allreduce(MPI.IN_PLACE, buf)`. The buffer holds zeros, so repeated sums stay zeros (no
overflow, no denormals) and every call does the same work. Repetitions alternate which side goes
first; each repetition's time is the slowest rank's. It prints the throughput ratio d500/native
(median over repetitions, with the quartiles of the per-repetition ratios), target >= 0.95; and,
for information, d500's ring_allreduce (Baidu's, on Sendrecv) against MPI's own algorithm.

Run it plainly and it starts itself under the venv's MPICH (`mpiexec -n 2`), or launch it:

    .venv/bin/python benchmarks/allreduce.py [--sizes 4,16,64] [--repetitions 15] [--number 5]
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/allreduce.py

On a shared machine the ranks' cores are shared with whatever else runs (MPICH's shared-memory
transport busy-polls): interleaving keeps both sides under the same load, not the load constant.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _args import repetitions
from _mpi import parse_under_mpiexec
from ratio import interleave, report

from d500.distributed.comm import Communicator


def slowest(comm: Communicator, times: list[float]) -> list[float]:
    """Per repetition, the slowest rank's time."""
    rows = comm.allgather(np.array(times, dtype=np.float64))
    return rows.max(axis=0).tolist()


def _sizes(text: str) -> list[float]:
    """argparse type of --sizes: buffer sizes in MB, each > 0 (a float32 element at least)."""
    try:
        sizes = [float(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or not all(s * 2**20 >= 4 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected sizes in MB > 0, comma-separated, got "
                                         f"{text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default="4,16,64",
                        help="buffer sizes in MB, comma-separated (e.g. 0.5,4)")
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=5, help="calls per timed repetition")
    args = parse_under_mpiexec(parser, argv, __file__)
    from mpi4py import MPI

    comm = Communicator.for_world()
    raw = MPI.COMM_WORLD
    if comm.size < 2:
        print("run under mpiexec -n 2 (or more)", file=sys.stderr)
        return 2
    if comm.rank == 0:
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"allreduce of float32 buffers over {comm.size} ranks ({library}), "
              f"{args.repetitions} repetitions x {args.number} calls; throughputs in MB/s of "
              f"buffer reduced")
    for mb in args.sizes:
        buf = np.zeros(int(mb * 2**20) // 4, dtype=np.float32)
        for _ in range(2):  # warm up both paths (first-touch pages, MPICH's shm buffers)
            comm.allreduce(buf)
            raw.Allreduce(MPI.IN_PLACE, buf)
            comm.ring_allreduce(buf)
        raw.Barrier()
        d500, native = interleave(lambda: comm.allreduce(buf),  # noqa: B023 (run in the loop)
                                  lambda: raw.Allreduce(MPI.IN_PLACE, buf),  # noqa: B023
                                  args.repetitions, args.number)
        d500, native = slowest(comm, d500), slowest(comm, native)
        raw.Barrier()
        ring, mpi = interleave(lambda: comm.ring_allreduce(buf),  # noqa: B023
                               lambda: raw.Allreduce(MPI.IN_PLACE, buf),  # noqa: B023
                               args.repetitions, args.number)
        ring, mpi = slowest(comm, ring), slowest(comm, mpi)
        if comm.rank == 0:
            report(f"{mb:g} MB Communicator.allreduce", d500, native, buf.nbytes / 1e6)
            report(f"{mb:g} MB ring_allreduce vs MPI's", ring, mpi, buf.nbytes / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
