"""Past one machine: an alpha-beta (latency-bandwidth) model of each scheme's step, fed by what a
run measured (compute time per step, every collective's calls and bytes per step) and by a network
(alpha, beta: measured here by d500.distributed.network, or a user's cluster), predicting the step
time and the scaling efficiency at 8 ... 1,024 ranks for each scheme and compressor.

    profile = Profile.from_run(ledger.get(run_id))          # a level-3 run at N0 >= 2 ranks
    net = parse_network("2us,12.5GB/s")
    step_time(profile, 64, net)                              # seconds, or None (not possible)
    rows = predict([profile, ...], net, SIZES)               # one Prediction per (profile, N)

A profile's buffer sizes come from its measured bytes per call, read back through the formula
its collective was counted with (comm.py): allreduce 2(N0-1)/N0 * B per rank, allgather (N0-1) * C,
broadcast and reduce B (received by a non-root, sent to the root), neighbour exchange 2B, a
parameter-server or a pipeline's micro-batch message B, ZeRO's reduce-scatter and allgatherv of
blocks (N0-1)/N0 * B. Time of one call at N ranks (Thakur, Rabenseifner and Gropp 2005;
Patarasuk and Yuan 2009):

    allreduce (ring)                       2(N-1) alpha + 2(N-1)/N B beta
    allgather (ring), C bytes per rank      (N-1) alpha + (N-1) C beta
    broadcast, reduce (scatter + ring)     (log2 N + N - 1) alpha + 2(N-1)/N B beta
    neighbour exchange (both neighbours)   2 alpha + 2 B beta
    point-to-point (ps, pipeline message)  alpha + B beta
    reduce-scatter, allgather of B/N blocks (N-1) alpha + (N-1)/N B beta

Scheme rules on top: dpsgd averages with both ring neighbours from 3 ranks on (an allreduce of the
model at 2); async_ps and ssp step no faster than their server, which takes one push and sends one
pull per worker and step: max(compute + push + pull, (N-1)(push + pull)). Compute time per step
scales with the per-rank batch (strong scaling: the global batch is fixed and cut into N shares, so
a step at N ranks costs compute(N0) * N0 / N; weak scaling keeps the per-rank batch). The efficiency
is throughput's: (samples per second at N) / (N * samples per second at 1 rank), i.e. at a fixed
global batch T(1) / (N T(N)); it says nothing of convergence at other batch sizes.

Tensor parallelism (a run at `tensor: T`, data 1): the model keeps T and grows the data dimension,
D = N / T (N a multiple of T). Each measured allreduce of the tensor ranks (per block, a partial
output forward and an input's gradient backward: Megatron's g and f) moves activations, which
shrink with the data group's share of the batch: at D it costs allreduce over T ranks of B / D
(strong; B weak). The data dimension then allreduces the rank's gradient G (its shard and the
replicated weights, `grad_bytes`) over D ranks, in ceil(G / bucket) calls. Compute scales as
1/D; one rank holds the whole model, compute T x the measured (which counts the split's
recomputed forward: an upper bound). Memory per rank stays what the run measured, params +
grads + optimizer state of 1/T of the split weights and all the replicated ones.

Pipeline parallelism (a run at `pipeline: P`, data D0, M micro-batches): the model keeps P and
grows the data dimension, D = N / P. A data group's share of the batch, b = B / D (strong; B / D0
weak), is cut into m = min(M, b) micro-batches; the costliest stage's passes of one step, C (the
measured compute x D0 / D), take C / m a micro-batch, and each micro-batch's crossing activations,
x = (bytes per sample over the costliest cut, from the run's recorded partition) x b / m, go
forward and their gradients come back: a slot costs C / m + 2 (alpha + x beta). GPipe and 1F1B
both flush every step, so the pipeline takes (m + P - 1) slots: the bubble (P - 1)/(m + P - 1) of
it idle. Then the data allreduce of the stage's gradient over D ranks in buckets (as tensor's;
a hybrid run measured at D0 > 1 allreduced it over its D0 data ranks: its allreduces are read
back over D0, not N0, and the gradient modelled is no less than they moved).
One rank holds the whole model: compute P x C / imbalance (the cut's FLOPs). Memory per rank: the
stage's params + grads + optimizer state (measured), plus the stashed micro-batch inputs: GPipe
holds all m, 1F1B at most P (schedule.stashed), each b / m samples of the bytes per sample the run
stashed.

Tensor parallelism inside pipeline stages (a run at `pipeline: P, tensor: T`, data 1): P and T
kept, D = N / (P T) grows. A slot is the pipeline's, plus the costliest stage's tensor
allreduces of one micro-batch over T ranks (the run's calls per step / its m0 micro-batches,
each on activations of b / m samples instead of the measured micro-batch's); its compute is a
tensor rank's as measured. Memory per rank: the rank's shard of its stage (1/T of the split
weights, the replicated ones whole) plus the stash, as a pipeline's. The data allreduce moves
at least the rank's parameter bytes (a smaller claimed gradient cannot shrink it).

Sharded data parallelism (a run at `shard: zero1|zero2|zero3`): its reduce-scatters and
allgathers of blocks are timed as above; memory per rank is what every rank holds whole plus the
sharded states cut N ways: ZeRO-1 shards the optimizer state (params and grads whole), ZeRO-2 the
gradients too, ZeRO-3 the parameters as well, plus the layers it holds gathered at once inside a
step (peak_param_bytes less the rows held; two when prefetching), at any size. The sharded total
is the sum of the ranks' shards as measured at N0 (the blocks partition it), so at N0 the model
gives back the measured bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from d500.distributed.network import Network
from d500.errors import UsageError

SIZES = tuple(2**k for k in range(3, 11))  # 8 ... 1,024 ranks
KINDS = {  # a collective's traffic name -> how the model times it
    "allreduce": "allreduce", "ring_allreduce": "allreduce", "ddp_allreduce": "allreduce",
    "dtensor_allreduce": "allreduce", "fsdp_gather_scatter": "blocks",  # torch's baselines
    "pipelining_send": "p2p",
    "allgather": "allgather", "broadcast": "tree", "reduce": "tree",
    "neighbour_exchange": "neighbour", "ps_push": "p2p", "ps_pull": "p2p",
    "reduce_scatter": "blocks", "allgatherv": "blocks",  # ZeRO: B cut into N blocks
    "send": "p2p", "recv": "p2p",  # a pipeline's micro-batch messages
}
SERVED = ("async_ps", "ssp")  # a server at rank 0 takes every worker's push and pull


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a step: its traffic name, calls per step, bytes per call (B; for an
    allgather the bytes each rank contributes)."""

    name: str
    calls: float
    nbytes: float

    @property
    def kind(self) -> str:
        return KINDS.get(self.name, "allreduce")


@dataclasses.dataclass(frozen=True)
class Profile:
    """One run's step as the model sees it (measured at `ranks` ranks)."""

    label: str  # e.g. "sync / topk"
    scheme: str
    compressor: str
    ranks: int
    compute: float  # seconds of computation per step per rank (median; the slowest rank's)
    step: float  # measured seconds per step (median, mean over ranks; for comparison)
    global_batch: int
    batch_mode: str
    collectives: tuple[Collective, ...]
    run_id: int | None = None
    tensor: int = 1  # tensor ranks (> 1: the collectives are the tensor dimension's)
    grad_bytes: float = 0.0  # a tensor rank's gradient bytes: the data dimension's allreduce
    bucket_bytes: float = 25 * 2**20
    memory: float | None = None  # bytes one rank holds (params + grads + optimizer state)
    pipeline: int = 1  # pipeline stages (> 1: P kept, the data dimension grows)
    micro: int = 1  # a pipeline's micro-batches per step, and their schedule
    schedule: str = "gpipe"
    crossing: float = 0.0  # bytes per sample over the costliest cut (the recorded partition)
    imbalance: float = 1.0  # the cut's costliest stage over the mean stage (FLOPs)
    activation: float = 0.0  # peak bytes of stashed micro-batch inputs on one rank (measured)
    shard: str = "none"  # ZeRO's stage (zero1, zero2, zero3) or none
    whole: float = 0.0  # a sharded run: bytes each rank holds whole (the most of any rank;
    # ZeRO-3: with the layers it holds gathered at once inside a step)
    sharded: float = 0.0  # a sharded run: bytes cut across the ranks (the sum of their shards)

    @property
    def group(self) -> int:
        """Ranks of one model replica (tensor x pipeline); the data dimension counts groups."""
        return self.tensor * self.pipeline

    @classmethod
    def from_run(cls, run: dict[str, Any]) -> Profile:
        """A profile from a recorded level-3 run (its details' per-rank figures)."""
        d, rid = run.get("details") or {}, run.get("id")
        ranks = d.get("ranks") or []
        n0 = int(run.get("world_size") or d.get("world_size") or 1)
        if run.get("level") != 3 or not ranks:
            raise UsageError(f"run {rid} is not a level-3 run with per-rank figures (it is a "
                             f"{run.get('status')} level-{run.get('level')} run of "
                             f"'{run.get('workload')}')")
        if n0 < 2:
            raise UsageError(f"run {rid} ran on 1 rank: it measured no communication; model a run "
                             f"at 2 or more ranks")
        medians = [r.get("compute_time_median") for r in ranks]
        computes = medians if all(c is not None for c in medians) else [
            r.get("compute_time_per_step") for r in ranks]
        steps = [r.get("step_time_median") or r["step_time"] for r in ranks]
        compute = max(c for c in computes if c is not None) if any(
            c is not None for c in computes) else min(steps)
        h = run.get("hyperparameters") or {}
        tensor, stages = int(h.get("tensor", 1)), int(h.get("pipeline", 1))
        data = n0 // (tensor * stages) if n0 % (tensor * stages) == 0 else n0
        # the ranks a measured allreduce ran over: a tensor group's (its activations), a
        # pipeline's data group's (each stage's gradient; a hybrid data x pipeline run), or all
        over = tensor if tensor > 1 else data if stages > 1 else n0
        names = sorted({n for r in ranks for n in r.get("collectives", {})})
        collectives = []
        for name in names:
            per = [r["collectives"].get(name, {}) for r in ranks]
            calls = max(p.get("calls", 0.0) for p in per)
            if calls <= 0:
                continue
            collectives.append(Collective(name, calls, _buffer(name, per, calls, over)))
        scheme, compressor = h.get("scheme", d.get("scheme", "?")), h.get("compressor", "none")
        label = scheme if compressor in ("none", None) else f"{scheme} / {compressor}"
        if h.get("shard", "none") != "none":
            label = f"{label} / {h['shard']}"
        if tensor > 1 and n0 != tensor * stages:
            inside = f" in each of {stages} pipeline stages" if stages > 1 else ""
            raise UsageError(f"run {rid} splits {tensor} tensor ways{inside} at {n0} ranks: the "
                             f"model reads a tensor run at data 1 (its allreduces are then the "
                             f"tensor dimension's); model a run at {tensor * stages} ranks")
        held = [r.get("scheme", {}) for r in ranks]
        memory = max((sum(m.get(k, 0.0) for k in ("param_bytes", "grad_bytes",
                                                    "optimizer_bytes")) for m in held),
                     default=0.0) or None
        label = f"{label} / tensor {tensor}" if tensor > 1 else label
        sharding = _sharding(h.get("shard", "none"), held)
        pipe = _pipeline(run, held, n0)
        if pipe:
            label = f"{label} / pipeline {pipe['pipeline']} x {pipe['micro']} {pipe['schedule']}"
            if n0 > pipe["pipeline"] * tensor:  # a hybrid run: its own line beside data 1's
                label = f"{label} / data {n0 // (pipe['pipeline'] * tensor)}"
        grads = max((max(m.get("grad_bytes", 0.0), m.get("param_bytes", 0.0)) for m in held),
                    default=0.0)  # every parameter's gradient is averaged
        if stages > 1 and tensor == 1:  # and no less than a stage's data allreduce moved
            grads = max(grads, _averaged(ranks, data))
        return cls(label, scheme, compressor or "none", n0, compute, sum(steps) / len(steps),
                   int(d.get("global_batch") or h.get("batch_size", 1)),
                   d.get("batch_mode", "global"), tuple(collectives), rid, tensor, grads,
                   float(h.get("bucket_bytes", 25 * 2**20)), memory, **pipe, **sharding)


SHARDED = {"zero1": ("optimizer_bytes",), "zero2": ("grad_bytes", "optimizer_bytes"),
           "zero3": ("param_bytes", "grad_bytes", "optimizer_bytes")}  # what each stage cuts


def _sharding(shard: str, held: list[dict[str, float]]) -> dict[str, Any]:
    """A sharded run's fields of its profile (none for other runs): its stage, the bytes each
    rank holds whole (the most of any rank) and the sum of the ranks' shards."""
    cut = SHARDED.get(shard)
    if cut is None or not held:
        return {}
    kept = [k for k in ("param_bytes", "grad_bytes", "optimizer_bytes") if k not in cut]
    # ZeRO-3 gathers a layer inside a step: its bytes above the rows held count at any size
    gathered = max((m["peak_param_bytes"] - m.get("param_bytes", 0.0) for m in held
                    if shard == "zero3" and "peak_param_bytes" in m), default=0.0)
    return {"shard": shard,
            "whole": max(sum(m.get(k, 0.0) for k in kept) for m in held) + max(gathered, 0.0),
            "sharded": sum(m.get(k, 0.0) for m in held for k in cut)}


def _pipeline(run: dict[str, Any], held: list[dict[str, float]], n0: int) -> dict[str, Any]:
    """A pipeline run's fields of its profile (none for other runs): P, M and the schedule from
    its hyperparameters, the cut's imbalance and crossing bytes per sample from its recorded
    partition (or what a rank sent a step over its data group's samples, where more), the
    ranks' peak stash."""
    h, d = run.get("hyperparameters") or {}, run.get("details") or {}
    stages = int(h.get("pipeline", 1))
    if stages < 2:
        return {}
    if n0 % stages:
        raise UsageError(f"run {run.get('id')} cuts {stages} pipeline stages at {n0} ranks")
    part = (d.get("scheme_details") or {}).get("partition") or {}
    cuts = [s.get("send_bytes_per_sample", 0.0) for s in part.get("stages", [])]
    groups = n0 // (stages * int(h.get("tensor", 1)))  # data groups (each tensor rank sends)
    samples = int(d.get("global_batch") or h.get("batch_size", 1)) / max(1, groups)
    sent = [r.get("collectives", {}).get("send", {}).get("sent", 0.0) / samples
            for r in d.get("ranks", [])]  # counted by the communicator (the judge's least_sent)
    return {"pipeline": stages, "micro": int(h.get("micro_batches", 1)),
            "schedule": str(h.get("pipeline_schedule", h.get("schedule", "gpipe"))),  # older
            # runs recorded it as `schedule`, over the learning-rate schedule's name
            "crossing": float(max([*cuts, *sent, 0])),  # a claimed smaller cut cannot shrink it
            "imbalance": float(part.get("imbalance", 1.0)),
            "activation": max((m.get("stash_bytes_peak", 0.0) for m in held), default=0.0)}


def _averaged(ranks: list[dict[str, Any]], data: int) -> float:
    """The most gradient bytes a step any rank of a hybrid data x pipeline run allreduced over
    its `data` ranks, read back from what it sent (2(D-1)/D of them; 0 at data 1)."""
    if data < 2:
        return 0.0
    return max((sum(t.get("sent", 0.0) for n, t in r.get("collectives", {}).items()
                    if KINDS.get(n, "allreduce") == "allreduce") * data / (2 * (data - 1))
                for r in ranks), default=0.0)


def _buffer(name: str, per_rank: list[dict[str, float]], calls: float, n0: int) -> float:
    """Bytes per call of a collective (B, or C for an allgather) from what the ranks counted per
    step, read back through the formula it was counted with (see the module docstring)."""
    sent = max(p.get("sent", 0.0) for p in per_rank) / calls
    received = max(p.get("received", 0.0) for p in per_rank) / calls
    kind = KINDS.get(name, "allreduce")
    if kind == "allreduce":  # (over one rank, nothing moves: the bytes as counted)
        return sent * n0 / (2 * (n0 - 1)) if n0 > 1 else sent
    if kind == "allgather":
        return sent / (n0 - 1)
    if kind == "blocks":  # rank r sends B less one block: the ranks together (N0-1) * B
        return sum(p.get("sent", 0.0) for p in per_rank) / calls / (n0 - 1)
    if kind == "neighbour":
        return sent / 2
    return max(sent, received)  # tree (root or non-root: B) and point-to-point messages


def call_time(kind: str, nbytes: float, n: int, net: Network) -> float:
    """Seconds of one call of a collective of this kind at `n` ranks."""
    a, b = net.alpha, net.beta
    if n < 2:
        return 0.0
    if kind == "allreduce":
        return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes * b
    if kind == "allgather":
        return (n - 1) * a + (n - 1) * nbytes * b
    if kind == "blocks":
        return (n - 1) * a + (n - 1) / n * nbytes * b
    if kind == "tree":
        return (math.log2(n) + n - 1) * a + 2 * (n - 1) / n * nbytes * b
    if kind == "neighbour":
        return 2 * a + 2 * nbytes * b
    return a + nbytes * b  # p2p


def impossible(profile: Profile, n: int, weak: bool = False) -> str | None:
    """Why the model has no step at `n` ranks (the table's "—", the plot's missing point), or
    None when it has one: strong scaling cuts the fixed global batch into one share per data
    rank, so it needs at least one sample per data rank; a tensor split of T (a pipeline of P
    stages) needs N a multiple of T x P."""
    t = profile.group
    if t > 1 and n > 1 and n % t:
        what = "tensor" if profile.pipeline == 1 else "pipeline" if profile.tensor == 1 else \
            "tensor x pipeline"
        return f"{n} ranks do not hold whole {what} groups of {t}"
    data = n // t if t > 1 and n > 1 else n
    if weak or profile.batch_mode == "per_rank" or profile.global_batch >= data:
        return None
    return (f"the global batch of {profile.global_batch} samples is smaller than the rank count "
            f"(strong scaling gives every rank a share of it; --weak keeps the per-rank batch)")


def _data(profile: Profile, n: int) -> int:
    """The data ranks at `n` ranks (a tensor or pipeline profile's groups; one rank: 1)."""
    return max(1, n // profile.group) if n > 1 else 1


def compute_time(profile: Profile, n: int, weak: bool) -> float | None:
    """Computation per step at `n` ranks (None when `impossible`: the global batch has fewer
    samples than ranks; a pipeline's: its costliest stage's passes); one rank computes a tensor
    profile's T shards, a pipeline's P stages (P x the costliest / the cut's imbalance)."""
    if impossible(profile, n, weak):
        return None
    whole = profile.compute * (profile.tensor * profile.pipeline / profile.imbalance
                               if n == 1 else 1)
    if weak or profile.batch_mode == "per_rank":
        return whole
    measured = profile.ranks // profile.group
    return whole * measured / _data(profile, n)


def comm_time(profile: Profile, n: int, net: Network, weak: bool = False) -> float:
    """Communication per step at `n` ranks (async_ps: the worker's own messages)."""
    if profile.tensor > 1:
        return tensor_comm_time(profile, n, net, weak)
    total = 0.0
    for c in profile.collectives:
        kind = c.kind
        if profile.scheme == "dpsgd" and c.name in ("allreduce", "neighbour_exchange"):
            kind = "allreduce" if n == 2 else "neighbour"
        total += c.calls * call_time(kind, c.nbytes, n, net)
    return total


def step_time(profile: Profile, n: int, net: Network, weak: bool = False) -> float | None:
    """Predicted seconds per step at `n` ranks, or None when that is not possible."""
    compute = compute_time(profile, n, weak)
    if compute is None:
        return None
    if n < 2:
        return compute
    if profile.pipeline > 1:
        return pipeline_time(profile, n, net, weak)
    comm = comm_time(profile, n, net, weak)
    if profile.scheme in SERVED:  # the server takes every worker's push and pull
        return max(compute + comm, (n - 1) * comm)
    return compute + comm


def tensor_comm_time(profile: Profile, n: int, net: Network, weak: bool = False) -> float:
    """A tensor profile's communication per step at `n` ranks (module docstring): its tensor
    allreduces over T ranks, on activations of the data group's share, then the data dimension's
    allreduce of the rank's gradient over N / T ranks."""
    if n < 2:
        return 0.0
    data = _data(profile, n)
    share = 1.0 if weak or profile.batch_mode == "per_rank" else \
        (profile.ranks // profile.tensor) / data
    return tensor_allreduces(profile, share, net) + data_allreduce(profile, data, net)


def tensor_allreduces(profile: Profile, share: float, net: Network) -> float:
    """The tensor dimension's measured allreduces of a step over T ranks, each on `share` x the
    activations it moved (a pipeline's point-to-point messages are its slots')."""
    return sum(c.calls * call_time("allreduce", c.nbytes * share, profile.tensor, net)
               for c in profile.collectives if c.kind != "p2p")


def data_allreduce(profile: Profile, data: int, net: Network) -> float:
    """A tensor or pipeline rank's gradient allreduced over the `data` ranks, in buckets."""
    if data < 2 or profile.grad_bytes <= 0:
        return 0.0
    calls = math.ceil(profile.grad_bytes / profile.bucket_bytes)
    return calls * call_time("allreduce", profile.grad_bytes / calls, data, net)


def _samples(profile: Profile, n: int, weak: bool) -> float:
    """A data group's samples per step at `n` ranks."""
    measured = profile.ranks // profile.group
    per_rank = weak or profile.batch_mode == "per_rank"
    return profile.global_batch / (measured if per_rank else _data(profile, n))


def micro_batches(profile: Profile, n: int, weak: bool = False) -> int:
    """A pipeline's micro-batches per step at `n` ranks: M, fewer where the share is smaller."""
    return max(1, min(profile.micro, int(_samples(profile, n, weak))))


def _micro_samples(profile: Profile, n: int, weak: bool) -> float:
    """Samples of one of a pipeline's micro-batches at `n` ranks."""
    return _samples(profile, n, weak) / micro_batches(profile, n, weak)


def p2p_bytes(profile: Profile, n: int, weak: bool = False) -> float:
    """Bytes of one micro-batch's activations over the costliest cut at `n` ranks (as many of
    their gradients come back)."""
    return profile.crossing * _micro_samples(profile, n, weak)


def bubble(profile: Profile, n: int, weak: bool = False) -> float | None:
    """A pipeline's idle share of its passes at `n` ranks, (P - 1)/(m + P - 1); None for others."""
    if profile.pipeline < 2 or impossible(profile, n, weak) or n < 2:
        return None
    from d500.distributed.pipeline.schedule import bubble as theory
    return theory(profile.pipeline, micro_batches(profile, n, weak))


def pipeline_time(profile: Profile, n: int, net: Network, weak: bool = False) -> float | None:
    """A pipeline profile's step at `n` ranks (module docstring): m + P - 1 slots of one
    micro-batch's passes (split over T: with its tensor allreduces) and its activations forward
    and gradients back, then the data allreduce of the stage's gradient."""
    stage = compute_time(profile, n, weak)
    if stage is None:
        return None
    m = micro_batches(profile, n, weak)
    slot = stage / m + 2 * call_time("p2p", p2p_bytes(profile, n, weak), 2, net)
    if profile.tensor > 1:  # the measured micro-batch's allreduces, on this one's samples
        m0, ratio = micro_batches(profile, profile.ranks, weak), _micro_samples(
            profile, n, weak) / _micro_samples(profile, profile.ranks, weak)
        slot += tensor_allreduces(profile, ratio, net) / m0
    return (m + profile.pipeline - 1) * slot + data_allreduce(profile, _data(profile, n), net)


def memory(profile: Profile, n: int, weak: bool = False) -> float | None:
    """Bytes one rank holds at `n` ranks: the run's params + grads + optimizer state, and for a
    pipeline its stashed micro-batch inputs (GPipe all m, 1F1B at most P, of b / m samples);
    None for a pipeline at one rank (no stage: the whole model's states were not measured); a
    sharded run's whole states plus its sharded total cut `n` ways."""
    if profile.shard != "none":
        return profile.whole + profile.sharded / n
    if profile.pipeline < 2:
        return profile.memory
    if profile.memory is None or n < 2 or impossible(profile, n, weak):
        return None
    from d500.distributed.pipeline.schedule import stashed
    p, s = profile.pipeline, profile.schedule
    held = stashed(s, 0, p, profile.micro) * _samples(profile, profile.ranks, weak) / profile.micro
    per_sample = profile.activation / held if held else 0.0
    m = micro_batches(profile, n, weak)
    return profile.memory + stashed(s, 0, p, m) * _samples(profile, n, weak) / m * per_sample


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One (profile, world size) of the model's table."""

    profile: Profile
    ranks: int
    step: float | None
    comm: float | None  # the step's time not computing (async_ps: waiting on its server too)
    efficiency: float | None
    reason: str | None = None  # why there is no step (scaling.impossible), when there is none
    bubble: float | None = None  # a pipeline's idle share of its passes
    memory: float | None = None  # bytes one rank holds

    @property
    def comm_share(self) -> float | None:
        return None if self.step is None or self.comm is None or self.step <= 0 else \
            min(1.0, self.comm / self.step)


def efficiency(profile: Profile, n: int, net: Network, weak: bool = False) -> float | None:
    """Throughput at `n` ranks over `n` times the throughput of one rank."""
    t1, tn = step_time(profile, 1, net, weak), step_time(profile, n, net, weak)
    if t1 is None or tn is None or tn <= 0:
        return None
    per_rank = weak or profile.batch_mode == "per_rank"
    measured = profile.ranks // profile.group  # data ranks: each its share of the batch
    samples_n = profile.global_batch / measured * _data(profile, n) if per_rank else \
        profile.global_batch
    samples_1 = profile.global_batch / measured if per_rank else profile.global_batch
    return (samples_n / tn) / (n * samples_1 / t1)


def predict(profiles: Sequence[Profile], net: Network, sizes: Sequence[int] = SIZES,
            weak: bool = False) -> list[Prediction]:
    """Every profile at every world size."""
    out = []
    for p in profiles:
        for n in sizes:
            t = step_time(p, n, net, weak)
            compute = compute_time(p, n, weak)
            c = None if t is None or compute is None else t - compute  # waiting on the server
            out.append(Prediction(p, n, t, c, efficiency(p, n, net, weak),
                                  impossible(p, n, weak), bubble(p, n, weak),
                                  memory(p, n, weak)))
    return out


def left_out(predictions: Sequence[Prediction]) -> list[str]:
    """One line per (profile, reason) the model has no step for: the world sizes it leaves out
    (the table's "—", the plot's missing points) and why."""
    groups: dict[tuple[str, str], list[int]] = {}
    for p in predictions:
        if p.step is None:
            groups.setdefault((p.profile.label, p.reason or "not possible"), []).append(p.ranks)
    return [f"{label}: no prediction at {_ranks(sizes)}: {reason}"
            for (label, reason), sizes in groups.items()]


def _ranks(sizes: Sequence[int]) -> str:
    text = [f"{n:,}" for n in sizes]
    return f"{text[0]} ranks" if len(text) == 1 else \
        f"{', '.join(text[:-1])} and {text[-1]} ranks"


def plot(predictions: Sequence[Prediction], net: Network, title: str = "",
         weak: bool = False) -> bytes:
    """PNG: predicted scaling efficiency against ranks (log2 axis, every world size asked for),
    one line per profile; the world sizes left out, and why, written under the axes."""
    from d500.leaderboard.plots import figure, png
    notes = left_out(predictions)
    fig = figure(7, 3.8 + 0.2 * len(notes))
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(p.profile.label for p in predictions))
    for i, label in enumerate(labels):
        points = [(p.ranks, p.efficiency) for p in predictions
                  if p.profile.label == label and p.efficiency is not None]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, color=f"C{i % 10}", label=label)
    ax.set_xscale("log", base=2)
    sizes = sorted({p.ranks for p in predictions})
    if sizes:
        ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)  # the sizes left out stay on the axis
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("ranks")
    ax.set_ylabel("predicted scaling efficiency")
    kind = "weak scaling (per-rank batch kept)" if weak else "strong scaling (global batch kept)"
    ax.set_title(title or f"alpha-beta model, {kind}, network {net.spec()}", fontsize=9)
    ax.grid(alpha=0.3)
    if labels:
        ax.legend(fontsize=7)
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=6.5, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05 * len(notes) if notes else 0, 1, 1))
    return png(fig)
