"""The network's latency alpha (s) and inverse bandwidth beta (s/byte) for the alpha-beta model:
measured on this machine by a short ping-pong or allreduce sweep, or given as `2us,12.5GB/s`.

    net = measure(comm)                       # under mpiexec -n 2 or more; every rank gets it
    net = parse_network("2us,12.5GB/s")       # a user's cluster (--network)
    net.alpha, net.beta, net.spec()           # 2e-06, 8e-11, '2us,12.5GB/s'

The sweep times each message size several times and keeps the median, then fits t = a + b*bytes by
least squares on relative error (so the 8-byte messages that fix the latency weigh as much as the
16 MB ones that fix the bandwidth). A ping-pong between ranks 0 and 1 gives alpha and beta of one
message (half a round trip). An allreduce sweep fits the whole MPI_Allreduce over all ranks and
reads alpha and beta through the ring model, t = 2(N-1) alpha + 2(N-1)/N bytes beta.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from typing import Any

import numpy as np

from d500.errors import UsageError

SIZES = tuple(8 * 4**k for k in range(11)) + (16 * 2**20,)  # 8 B ... 8 MB by 4, and 16 MB
REPEATS = 5
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"K": 2.0**10, "k": 2.0**10, "M": 2.0**20, "G": 2.0**30, "T": 2.0**40}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_LATENCY = re.compile(rf"{_NUMBER}\s*(s|ms|us|µs|ns)")
_BANDWIDTH = re.compile(rf"{_NUMBER}\s*([kKMGT]?)(i?)(B|b|bit)/s")


class NetworkError(UsageError):
    """A bad --network value, or a measurement that cannot be made."""


@dataclasses.dataclass(frozen=True)
class Network:
    """Latency alpha (seconds per message) and inverse bandwidth beta (seconds per byte)."""

    alpha: float
    beta: float
    source: str = "given"  # "given", "ping-pong" or "allreduce"
    samples: tuple[tuple[int, float], ...] = ()  # measured (bytes, seconds), median per size

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return 1.0 / self.beta

    def time(self, nbytes: float, messages: float = 1.0) -> float:
        """Seconds for `messages` messages carrying `nbytes` bytes in all."""
        return messages * self.alpha + nbytes * self.beta

    def spec(self) -> str:
        """A string parse_network reads back: latency in us, bandwidth in GB/s."""
        return f"{self.alpha * 1e6:.4g}us,{self.bandwidth / 1e9:.4g}GB/s"


def parse_network(text: str, what: str = "--network") -> Network:
    """`LATENCY,BANDWIDTH` (e.g. `2us,12.5GB/s`, `1.5e-6s,100Gb/s`, `0.8us,10GiB/s`) as a
    Network; latency in s/ms/us/ns, bandwidth in B/s or b/s (bits) with k/M/G/T (powers of 1000)
    or Ki/Mi/Gi/Ti (powers of 1024)."""
    def bad(why: str) -> NetworkError:
        return NetworkError(f"{what} {text!r}: {why}; expected LATENCY,BANDWIDTH such as "
                            f"2us,12.5GB/s")

    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 2:
        raise bad("not two comma-separated values")
    lat, bw = _LATENCY.fullmatch(parts[0]), _BANDWIDTH.fullmatch(parts[1])
    if lat is None:
        raise bad(f"latency {parts[0]!r} is not a number with a unit s, ms, us or ns")
    if bw is None:
        raise bad(f"bandwidth {parts[1]!r} is not a number with a unit such as GB/s or Gb/s")
    alpha = float(lat.group(1)) * _SECONDS[lat.group(2)]
    prefix, binary, unit = bw.group(2), bw.group(3), bw.group(4)
    if binary and not prefix:
        raise bad(f"bandwidth unit {parts[1]!r} has 'i' without a prefix")
    scale = _BINARY[prefix] if binary else _PREFIX[prefix]
    bandwidth = float(bw.group(1)) * scale / (1.0 if unit == "B" else 8.0)
    if not (math.isfinite(alpha) and alpha >= 0):
        raise bad("latency must be a finite number >= 0")
    if not (math.isfinite(bandwidth) and bandwidth > 0):
        raise bad("bandwidth must be a finite number > 0")
    return Network(alpha, 1.0 / bandwidth, "given")


def fit(samples: list[tuple[int, float]] | tuple[tuple[int, float], ...]) -> tuple[float, float]:
    """Least-squares (a, b) of t = a + b * bytes on relative error, clamped to a >= 0, b > 0."""
    if len({n for n, _ in samples}) < 2:
        raise NetworkError("fitting latency and bandwidth needs at least two message sizes")
    n = np.array([s for s, _ in samples], dtype=float)
    t = np.array([s for _, s in samples], dtype=float)
    design = np.stack([1.0 / t, n / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return max(float(a), 0.0), max(float(b), 1e-15)


def pingpong(comm: Any, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS
             ) -> list[tuple[int, float]]:
    """Median one-way seconds of a message of each size between ranks 0 and 1 (half a round
    trip); ranks 0 and 1 return the samples, the others take no part and return []."""
    mpi, rank = comm.mpi, comm.rank
    if rank > 1:
        return []
    other = 1 - rank
    samples = []
    for size in sizes:
        buf = np.zeros(size, dtype=np.uint8)
        inner = 20 if size <= 65536 else 3
        times = []
        for r in range(repeats + 1):  # the first repetition warms up
            start = time.perf_counter()
            for _ in range(inner):
                if rank == 0:
                    mpi.Send(buf, dest=other, tag=7)
                    mpi.Recv(buf, source=other, tag=7)
                else:
                    mpi.Recv(buf, source=other, tag=7)
                    mpi.Send(buf, dest=other, tag=7)
            if r:
                times.append((time.perf_counter() - start) / inner / 2)
        samples.append((size, statistics.median(times)))
    return samples


def allreduce_sweep(comm: Any, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS
                    ) -> list[tuple[int, float]]:
    """Median seconds of an in-place MPI_Allreduce (float32 sum) of each size (at least one
    float), the slowest rank's time per repetition; every rank returns the samples."""
    from mpi4py import MPI
    mpi = comm.mpi
    samples = []
    for size in sizes:
        buf = np.zeros(max(1, size // 4), dtype=np.float32)
        inner = 20 if size <= 65536 else 3
        times = []
        for r in range(repeats + 1):
            mpi.Barrier()
            start = time.perf_counter()
            for _ in range(inner):
                mpi.Allreduce(MPI.IN_PLACE, buf)
            if r:
                times.append(mpi.allreduce((time.perf_counter() - start) / inner, op=MPI.MAX))
        samples.append((buf.nbytes, statistics.median(times)))
    return samples


def measure(comm: Any, method: str = "ping-pong", sizes: tuple[int, ...] = SIZES,
            repeats: int = REPEATS) -> Network:
    """Alpha and beta of this machine's MPI from a sweep (`method` "ping-pong" or "allreduce"),
    fitted on rank 0 and broadcast: every rank returns the same Network. Needs 2+ ranks."""
    if comm.size < 2:
        raise NetworkError("measuring the network needs at least 2 ranks (mpiexec -n 2); or "
                           "give the network as --network LATENCY,BANDWIDTH")
    if method not in ("ping-pong", "allreduce"):
        raise NetworkError(f"unknown network measurement {method!r}: use ping-pong or allreduce")
    comm.mpi.Barrier()
    if method == "ping-pong":
        samples = pingpong(comm, sizes, repeats)
    else:
        samples = allreduce_sweep(comm, sizes, repeats)
    fitted = np.zeros(2 + 2 * len(sizes), dtype=np.float64)
    if comm.rank == 0:
        a, b = fit(samples)
        if method == "allreduce":  # the ring model: a = 2(N-1) alpha, b = 2(N-1)/N beta
            n = comm.size
            a, b = a / (2 * (n - 1)), b * n / (2 * (n - 1))
        fitted[:2] = a, b
        fitted[2:] = np.array(samples, dtype=np.float64).reshape(-1)
    comm.mpi.Bcast(fitted, root=0)
    pairs = fitted[2:].reshape(-1, 2)
    return Network(float(fitted[0]), float(fitted[1]), method,
                   tuple((int(n), float(t)) for n, t in pairs))

