"""How a d500 process learns that an MPI launcher started it (mpiexec, srun, ...), and its world:
read from the launcher's environment, so a plain process never imports mpi4py or NumPy."""

from __future__ import annotations

import os
from typing import Any

LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                      "OMPI_COMM_WORLD_RANK")
LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def launched_by_mpi() -> bool:
    """Whether an MPI launcher started this process (read from its environment: MPI itself is
    not imported, so a plain `d500` command never initialises it)."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def launcher_rank() -> int | None:
    """This process's rank as its MPI launcher says, when it runs with other ranks (a world of
    one, or no launcher, is None)."""
    rank = next((os.environ[v] for v in RANK_VARIABLES if v in os.environ), "")
    size = next((os.environ[v] for v in SIZE_VARIABLES if v in os.environ), "")
    if not rank.isdigit() or size == "1":
        return None
    return int(rank)


_shared: str | None = None  # the OMP_NUM_THREADS share_cores() set (so not the user's)


def local_ranks() -> int:
    """How many ranks of this job run on this host, as the launcher says (1 when it does not)."""
    local = next((os.environ[v] for v in LOCAL_SIZE_VARIABLES if v in os.environ), "")
    return int(local) if local.isdigit() and int(local) > 0 else 1


def core_share() -> tuple[int, str] | None:
    """Each rank's thread count when several ranks share this host, and why: OMP_NUM_THREADS
    when the user set it, else the host's cores divided among its ranks; None with one rank
    here (the framework's, or d500's, default then)."""
    user = os.environ.get("OMP_NUM_THREADS", "").strip()
    if user and user != _shared and user.isdigit() and int(user) >= 1:
        return int(user), "OMP_NUM_THREADS, as the user set it for the MPI ranks"
    local = local_ranks()
    if local < 2:
        return None
    cores = os.cpu_count() or 1
    return (max(1, cores // local),
            f"default under MPI: this host's {cores} cores shared by its {local} ranks")


def share_cores() -> None:
    """Give each rank its share of this machine's cores (OMP_NUM_THREADS, read by torch when it
    is imported) unless the user set it; K ranks of a full-width framework would each start a
    thread per core. Call before a framework is imported."""
    global _shared
    share = core_share()
    if share is not None and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = _shared = str(share[0])


def world() -> Any:
    """MPI's COMM_WORLD when this process runs under an MPI launcher with other ranks, else
    None (mpi4py is imported only under a launcher; `mpiexec -n 1` gives None too)."""
    if not launched_by_mpi():
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def will_join() -> None:
    """Mark this rank as one on its way to MPI_Init (`joins`), which every rank of the job must
    reach before any returns from it."""
    global _joining
    _joining = True


def joins() -> bool:
    """Whether this rank is on its way to MPI_Init (`will_join`): a ^C before it got there ended
    it, and its peers waited in MPI_Init for it forever (mpiexec and a rank spinning a core;
    1 in 6 ^Cs during `mpiexec -n 2 d500 train`'s start-up), a rank held in C not even seeing
    the ^C hydra passed on. So an interrupted rank that joins goes there, then ends the job."""
    return _joining


_joining = False


def silence_limit(default: float) -> float:
    """Seconds an MPI rank may stay silent before it is given up: $D500_MPI_TIMEOUT, else
    `default` (each caller has its own); a value that is not a positive number is a D500Error."""
    from d500.errors import D500Error
    text = os.environ.get("D500_MPI_TIMEOUT", "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise D500Error(f"D500_MPI_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value
