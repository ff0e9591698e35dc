"""A level-3 run's figures from what every rank measured (gathered to rank 0): bytes per step,
time in communication and computation, the compression ratio, and the scaling efficiency and
speed-up against the same entry's runs at the workload's reference world size.

Per rank, `RankStats` holds its training-step figures only: the traffic of evaluations (a
scheme's model averaging before validation) and of the start-up broadcast is kept apart.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

MEMORY = ("param_bytes", "grad_bytes", "optimizer_bytes")  # a scheme's memory(), per rank
BUBBLE_FLOOR = 0.4  # of the theory's bubble: the least mean wait believed. Unequal stages can
# wait less than the theory: d500's last stage runs its forward and backward at once, beside the
# stage before's forwards (P = 2, large M: 1/(2M) against 1/(M+1)); over 20,000 random stage
# costs (P = 2..5, schedule.simulate) the mean was never below 0.54 x the theory, the margin is
# for the stages' clocks starting apart (honest runs here: 0.96 x at M = 1)


@dataclasses.dataclass
class RankStats:
    """What one rank measured over a run's training steps (traffic: per collective name, as
    Communicator.counters() gives it)."""

    rank: int
    host: str
    pid: int
    steps: int = 0
    step_seconds: float = 0.0  # wall time inside the scheme's steps (computation +
    # communication) and its settle() after each chunk of steps (what they left in flight)
    comm_seconds: float | None = 0.0  # inside the collectives, within those (None: not
    # separable); each step's at most that step's seconds, so compute = step - comm >= 0
    sent: int = 0  # bytes, training collectives
    received: int = 0
    traffic: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    eval_traffic: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    loss_sum: float = 0.0
    loss_count: int = 0
    payload_bytes: int = 0  # a compressor's payload bytes (reducer), and the dense equivalent
    dense_bytes: int = 0
    scheme: dict[str, float] = dataclasses.field(default_factory=dict)
    scheme_details: dict[str, Any] = dataclasses.field(default_factory=dict)
    cpu_seconds: float = 0.0  # this rank's process CPU time over the run (every thread)
    step_median: float | None = None  # seconds: the median step, and the median of step minus
    compute_median: float | None = None  # its collectives' seconds (robust to descheduling)

    @property
    def compute_seconds(self) -> float | None:
        return None if self.comm_seconds is None else self.step_seconds - self.comm_seconds


def aggregate(ranks: list[RankStats], param_bytes: int | None = None,
              stages: dict[int, int] | None = None,
              least: dict[int, int] | None = None,
              peaks: dict[int, int] | None = None,
              bubble: float | None = None) -> dict[str, float]:
    """The run's communication figures: means over ranks of per-rank values (every rank's own
    figures stay in the run's details), and memory_per_rank and peak_param_bytes where the
    ranks' claims fit the judge's model of `param_bytes` (held_memory; `stages`: a pipeline's
    parameter bytes per rank; `peaks`: peak_memory's floors). The bytes are left out where a
    rank says it sent less a step than `least` (rank -> bytes its part of the model must send,
    from the judge's own cut or split). A pipeline's bubble_fraction is left out where the
    stages' mean is below BUBBLE_FLOOR x `bubble`, the judge's own (P-1)/(M+P-1): no stages wait
    that little on average, so a lower claim (a rank that says it never waited) is not a
    measurement. A claim between the floor and the truth is not caught. comm_time, compute_time
    and comm_share are left out where a rank's times are not `timed`."""
    out: dict[str, float] = {"step_time": statistics.fmean(r.step_seconds / max(1, r.steps)
                                                           for r in ranks)}
    if least is None or all(r.sent / max(1, r.steps) >= least.get(r.rank, 0) for r in ranks):
        out["bytes_per_step"] = statistics.fmean(r.sent / max(1, r.steps) for r in ranks)
        out["bytes_received_per_step"] = statistics.fmean(r.received / max(1, r.steps)
                                                          for r in ranks)
    if all(timed(r) for r in ranks):
        comm = [r.comm_seconds or 0.0 for r in ranks]
        total = sum(r.step_seconds for r in ranks)
        out["comm_time"] = statistics.fmean(comm)
        out["compute_time"] = statistics.fmean(r.compute_seconds or 0.0 for r in ranks)
        out["comm_share"] = sum(comm) / total if total > 0 else math.nan
    stale = [r.scheme["staleness_max"] for r in ranks if "staleness_max" in r.scheme]
    if stale:  # a parameter server's (async_ps, ssp): the stalest gradient it applied
        out["staleness_max"] = max(stale)
    waits = [r.scheme["bubble_measured"] for r in ranks if "bubble_measured" in r.scheme]
    if waits:  # a pipeline's stages: waiting for their neighbours, and the theory's figure
        theory = ranks[0].scheme["bubble_theory"] if bubble is None else bubble
        out["bubble_theory"] = theory
        if statistics.fmean(waits) >= BUBBLE_FLOOR * theory:
            out["bubble_fraction"] = statistics.fmean(waits)
    held = held_memory(ranks, param_bytes, stages)
    peak = peak_memory(ranks, peaks) if held is not None else None
    if held is not None and (peaks is None or peak is not None):
        out["memory_per_rank"] = held
    if peak is not None:
        out["peak_param_bytes"] = peak
    payload = sum(r.payload_bytes for r in ranks)
    if payload > 0:
        out["compression_ratio"] = sum(r.dense_bytes for r in ranks) / payload
    return out


def timed(r: RankStats) -> bool:
    """Whether a rank's communication seconds are a part of its step seconds: measured
    (not None), finite and 0 <= comm <= step. The loop keeps each step's collectives within the
    step; a rank saying more (comm_share > 1, negative compute) says what no clock measured."""
    c, s = r.comm_seconds, r.step_seconds
    return (all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (c, s))
            and math.isfinite(c) and math.isfinite(s) and 0.0 <= c <= s)


def held_memory(ranks: list[RankStats], param_bytes: int | None,
                stages: dict[int, int] | None = None) -> float | None:
    """The most bytes any rank says it holds (parameters + gradients + optimizer state), or None
    when a rank said nothing or the claims do not fit the model the judge holds: every rank
    holds all B parameter bytes (ZeRO 1/2 shard no parameters), or, in a pipeline, exactly its
    stage's (`stages`: rank -> bytes, from the judge's own cut of the model), no more gradient
    than that, and the ranks' gradients add up to at least one whole gradient (ZeRO-2's blocks
    cover it once). The ranks run the entry's code, so a claim is checked against what the judge
    knows; the optimizer state's bytes, which depend on the entry's optimizer, are only checked
    to be >= 0."""
    claims = [r.scheme for r in ranks]
    if not claims or not all(all(k in c for k in MEMORY) for c in claims):
        return None
    if param_bytes is not None:
        own = [param_bytes if stages is None else stages.get(r.rank, -1) for r in ranks]
        if (any(c["param_bytes"] != b for c, b in zip(claims, own))
                or sum(c["grad_bytes"] for c in claims) < param_bytes
                or any(c["grad_bytes"] > b or c["optimizer_bytes"] < 0
                       for c, b in zip(claims, own))):
            return None
    return max(sum(c[k] for k in MEMORY) for c in claims)


def peak_memory(ranks: list[RankStats], peaks: dict[int, int] | None = None) -> float | None:
    """The most parameter bytes any rank says it held at once inside a step, or None when a rank
    said nothing or claims less than it holds between steps, or than `peaks` (rank -> the bytes
    its part of the model must hold at once: ZeRO-3's rows and gathered layers, from the judge's
    own copy of the graph)."""
    claims = [(r.rank, r.scheme) for r in ranks]
    if not claims or not all("peak_param_bytes" in c and "param_bytes" in c for _, c in claims):
        return None
    floor = peaks or {}
    if any(c["peak_param_bytes"] < max(c["param_bytes"], floor.get(r, 0)) for r, c in claims):
        return None
    return max(c["peak_param_bytes"] for _, c in claims)


def scaling(ledger: Any, run_id: int | None, workload: Any, submission: str, backend: str,
            world: int, time_to_accuracy: float) -> dict[str, float]:
    """scaling_efficiency = (ref * T_ref) / (N * T_N) and speedup = T_ref / T_N, with T_ref the
    median time to accuracy of this entry's succeeded runs of the same workload rules at the
    reference world size, on the same hardware at the same per-rank thread count (empty when
    there is none, or this run missed its target)."""
    ref = workload.reference_ranks
    if not math.isfinite(time_to_accuracy) or time_to_accuracy <= 0:
        return {}
    if world == ref:
        return {"scaling_efficiency": 1.0, "speedup": 1.0}
    here = threads = None
    if run_id is not None:
        from d500.leaderboard.environments import machine
        provenance = ledger.get(run_id)["provenance"] or {}
        here, threads = machine(provenance), (provenance.get("threads") or {}).get("count")
    t_ref = reference_time(ledger, workload.level, workload.name, submission, backend, ref,
                           exclude=run_id, sha=_sha(workload.path), machine_key=here,
                           threads=threads)
    if t_ref is None:
        return {}
    return {"scaling_efficiency": ref * t_ref / (world * time_to_accuracy),
            "speedup": t_ref / time_to_accuracy}


def reference_time(ledger: Any, level: int, workload: str, submission: str, backend: str,
                   world: int, exclude: int | None = None, sha: str | None = None,
                   machine_key: str | None = None, threads: int | None = None
                   ) -> float | None:
    """Median time to accuracy of the entry's own succeeded runs at `world` ranks (None: none);
    with `machine_key`, only runs on that hardware (a time from another machine is no
    reference), with `threads`, only runs at that per-rank thread count (a reference at 2
    threads a rank against ranks at 1 measures threads, not scaling), never runs imported from
    a package or reproducing one."""
    from d500.leaderboard.environments import machine
    from d500.leaderboard.ranking import origin

    envs = ledger.environments() if machine_key is not None or threads is not None else {}
    times = [r["figures"]["time_to_accuracy"] for r in ledger.runs(
                 level=level, workload=workload, submission=submission, backend=backend,
                 status="succeeded")
             if r["id"] != exclude and (r["world_size"] or 1) == world
             and (sha is None or r["workload_sha256"] == sha) and origin(r) is None
             and (machine_key is None or machine(envs.get(r["environment"])) == machine_key)
             and (threads is None or ((envs.get(r["environment"]) or {}).get("threads")
                                      or {}).get("count") == threads)
             and math.isfinite(r["figures"].get("time_to_accuracy", math.inf))]
    return statistics.median(times) if times else None


def _sha(path: Any) -> str | None:
    from d500.ledger import sha256_file
    try:
        return sha256_file(path)
    except OSError:
        return None


def details(ranks: list[RankStats]) -> list[dict[str, Any]]:
    """Every rank's own figures, for the run's details (and `d500 scale RUN_ID`)."""
    out = []
    for r in ranks:
        steps = max(1, r.steps)
        out.append({
            "rank": r.rank, "host": r.host, "pid": r.pid, "steps": r.steps,
            "step_time": r.step_seconds / steps, "step_time_median": r.step_median,
            "cpu_seconds": r.cpu_seconds,
            "compute_time_median": r.compute_median,
            "comm_time": None if r.comm_seconds is None else r.comm_seconds,
            "compute_time": r.compute_seconds,
            "compute_time_per_step": (None if r.compute_seconds is None
                                      else r.compute_seconds / steps),
            "bytes_sent_per_step": r.sent / steps, "bytes_received_per_step": r.received / steps,
            "collectives": {name: {k: v / steps for k, v in t.items()}  # per step
                            for name, t in r.traffic.items()},
            "eval_collectives": r.eval_traffic,
            "train_loss": r.loss_sum / r.loss_count if r.loss_count else None,
            "scheme": r.scheme,
        })
    return out
