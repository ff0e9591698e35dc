"""A level-3 entry's `distributed:` mapping (in its submission.yaml), validated: the scheme and its
options, the gradient compressor and its parameters, the tensor-fusion bucket size, and how the
world splits into parallel dimensions.

    distributed:
      scheme: sync                 # one of d500's schemes (d500.distributed.schemes) or ddp
      options: {}                  # the scheme's own options (e.g. local_sgd's period)
      compression: {name: topk, density: 0.01}   # a compressor and its parameters (default none)
      bucket_mb: 25                # tensor fusion: bytes per bucket in MiB (torch DDP's default)
      data: 2                      # the dimensions: data x pipeline x tensor == the world size
      pipeline: 1                  #   (data defaults to world / (pipeline x tensor); a flat
      tensor: 1                    #   `scheme:` alone is data parallelism over every rank)
      shard: zero2                 # none | zero1 | zero2 | zero3: ZeRO over the data dimension
      micro_batches: 4             # pipeline > 1: micro-batches per step (distributed.pipeline)
      schedule: 1f1b               #   and their order: gpipe | 1f1b

`ddp` is torch's DistributedDataParallel (gloo), the native baseline, `fsdp` torch's FSDP2
(fully_shard), the sharded one, `dtensor` torch's DTensor tensor parallelism (with tensor: T at
T ranks) and `pipelining` torch.distributed.pipelining (with pipeline: P, micro_batches and
schedule, at P ranks): they take no compression and run on the torch backend only.
The scheme is the data dimension's; `shard` (ZeRO: optimizer state, then gradients, then
parameters sharded over the data ranks) goes with `sync` only, as the schemes that move whole
models (ps, async_ps, ssp, dpsgd, local_sgd) and the native baselines have nothing to shard.
A pipeline (> 1 stages) composes with the data dimension through sync's allreduce of each
stage's gradients (no shard, no compression). zero3 (parameters sharded too) gathers layer by
layer (d500.distributed.schemes.zero3); a model with running statistics whole, on torch only.
Tensor parallelism (> 1, d500.distributed.tensor) composes with the
data dimension as a pipeline does (sync, no shard, no compression), and with a pipeline: each
stage split over its tensor group (d500.distributed.pipeline.split_stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, UsageError, listed

NATIVE = "ddp"  # torch DistributedDataParallel, d500.distributed.ddp
FSDP = "fsdp"  # torch FSDP2 (fully_shard), d500.distributed.fsdp: the sharded native baseline
DTENSOR = "dtensor"  # torch DTensor tensor parallel, d500.distributed.dtensor (tensor: T ranks)
PIPELINING = "pipelining"  # torch.distributed.pipelining, d500.distributed.pipelining
BASELINES = (NATIVE, FSDP, DTENSOR, PIPELINING)  # torch's own: torch backend only, uncompressed
DEFAULT_BUCKET_MB = 25.0
KEYS = ("scheme", "options", "compression", "bucket_mb", "data", "pipeline", "tensor", "shard",
        "micro_batches", "schedule")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")  # d500.distributed.pipeline.schedule
DIMENSIONS = ("data", "pipeline", "tensor")
SHARDS = ("none", "zero1", "zero2", "zero3")
SHARDABLE = ("sync",)  # the schemes whose update a ZeRO stage can shard
# the options of a sharded run (the stage is its shard's; zero3.Zero3 takes prefetch)
SHARD_OPTIONS = {"zero1": (), "zero2": (), "zero3": ("prefetch",)}
# MLPerf's lowest_numerical_precision_in_comm per compressor (what crosses the wire)
PRECISION = {"none": "fp32", "fp16": "fp16", "topk": "fp32", "randomk": "fp32", "qsgd": "int8",
             "efsignsgd": "int1", "powersgd": "fp32"}


@dataclass(frozen=True)
class Spec:
    """What an entry chose for its distributed run."""

    scheme: str
    options: dict[str, Any] = field(default_factory=dict)
    compressor: str = "none"
    compression: dict[str, Any] = field(default_factory=dict)  # the compressor's parameters
    bucket_bytes: int = int(DEFAULT_BUCKET_MB * 2**20)
    where: str = "submission.yaml"
    data: int | None = None  # None: the world size / (pipeline x tensor)
    pipeline: int = 1
    tensor: int = 1
    shard: str = "none"
    micro_batches: int = 1  # a pipeline's micro-batches per step, and their schedule
    schedule: str = "gpipe"

    @property
    def native(self) -> bool:
        return self.scheme in BASELINES

    @property
    def comm_precision(self) -> str:
        """The lowest precision of what crosses the wire (MLLOG's key)."""
        return PRECISION.get(self.compressor, "fp32")

    def dims(self, world: int) -> dict[str, int]:
        """{data, pipeline, tensor} at `world` ranks; a UsageError (one line naming the file and
        the fields) unless data x pipeline x tensor == world."""
        data = self.data if self.data is not None else world // (self.pipeline * self.tensor)
        if self.data is None and (data < 1 or data * self.pipeline * self.tensor != world):
            group = self.pipeline * self.tensor
            raise UsageError(f"{self.where}: fields 'distributed.pipeline' x 'tensor' = "
                             f"{self.pipeline} x {self.tensor} = {group} ranks do not divide the "
                             f"world size {world} (mpiexec -n {world}): run at a multiple of "
                             f"{group} ('distributed.data', not given, is the world size / "
                             f"{group})")
        if data * self.pipeline * self.tensor != world or data < 1:
            need = data * self.pipeline * self.tensor
            raise UsageError(f"{self.where}: fields 'distributed.data' x 'pipeline' x 'tensor' "
                             f"= {self.data} x {self.pipeline} x {self.tensor} must equal the "
                             f"world size {world} (mpiexec -n {world}): the entry runs at "
                             f"mpiexec -n {need}")
        return {"data": data, "pipeline": self.pipeline, "tensor": self.tensor}

    def logged(self) -> dict[str, Any]:
        """The choices as run hyperparameters (ledger and MLLOG)."""
        out: dict[str, Any] = {"scheme": self.scheme, "compressor": self.compressor,
                               "bucket_bytes": self.bucket_bytes}
        # the dimensions where declared (a flat scheme's record stays what it always was)
        out.update({k: v for k, v in (("data", self.data), ("pipeline", self.pipeline),
                                      ("tensor", self.tensor), ("shard", self.shard))
                    if v not in (None, 1, "none")})
        if self.pipeline > 1:  # its own key: `schedule` is the recipe's learning-rate schedule
            out.update(micro_batches=self.micro_batches, pipeline_schedule=self.schedule)
        out.update({f"scheme_{k}": v for k, v in self.options.items()})
        out.update({f"compressor_{k}": v for k, v in self.compression.items()})
        return out


def data_ranks(world: int, logged: dict[str, Any]) -> int:
    """The ranks that share each global batch at `world` ranks, from a run's hyperparameters
    (`Spec.logged`: pipeline and tensor where > 1): a pipeline's stages see the same samples."""
    return world // (int(logged.get("pipeline", 1)) * int(logged.get("tensor", 1)))


def known_schemes() -> list[str]:
    """d500's schemes and the native baseline."""
    from d500.distributed.schemes import SCHEMES
    return [*SCHEMES, *BASELINES]


def parse(mapping: dict[str, Any] | None, path: str | Path) -> Spec:
    """The `distributed:` mapping of the submission file `path` as a Spec; a problem is a
    ConfigError (an unknown scheme a UsageError) naming the file and the field."""
    where = str(path)
    if not mapping:
        raise ConfigError(f"{where}: a level-3 entry needs a 'distributed' mapping with at least "
                          f"'scheme' (known: {', '.join(known_schemes())})")
    unknown = sorted(set(mapping) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown field 'distributed.{unknown[0]}' (allowed: "
                          f"{listed(unknown[0], KEYS)})")
    scheme = mapping.get("scheme")
    if not isinstance(scheme, str):
        raise ConfigError(f"{where}: field 'distributed.scheme' must name a scheme (known: "
                          f"{', '.join(known_schemes())})")
    if scheme not in known_schemes():
        raise UsageError(f"{where}: field 'distributed.scheme': unknown scheme '{scheme}' "
                         f"(known: {listed(scheme, known_schemes())})")
    options = mapping.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"{where}: field 'distributed.options' must be a mapping")
    compression = mapping.get("compression") or {"name": "none"}
    if isinstance(compression, str):
        compression = {"name": compression}
    if not isinstance(compression, dict) or not isinstance(compression.get("name"), str):
        raise ConfigError(f"{where}: field 'distributed.compression' must be a mapping with "
                          f"'name' (a compressor) and its parameters")
    params = {k: v for k, v in compression.items() if k != "name"}
    name = compression["name"]
    if scheme in BASELINES and name != "none":
        raise ConfigError(f"{where}: field 'distributed.compression': the {scheme} baseline "
                          f"runs torch's own collectives uncompressed; compress with a d500 "
                          f"scheme")
    from d500.distributed import compression as compressors
    compressors.make(name, params, where=f"{where}: field 'distributed.compression'")
    mb = mapping.get("bucket_mb", DEFAULT_BUCKET_MB)
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not (
            math.isfinite(mb) and mb > 0):
        raise ConfigError(f"{where}: field 'distributed.bucket_mb' must be a positive number "
                          f"of MiB, got {mb!r}")
    dims = {k: _dimension(mapping, k, where) for k in DIMENSIONS}
    shard = mapping.get("shard", "none")
    if shard not in SHARDS:
        raise ConfigError(f"{where}: field 'distributed.shard' must be one of "
                          f"{', '.join(SHARDS)}, got {shard!r}")
    from d500.distributed.schemes import SCHEMES
    flat = scheme in SCHEMES and (dims["pipeline"] or 1) == 1 and (dims["tensor"] or 1) == 1
    known = list(SHARD_OPTIONS[shard] if shard != "none" else
                 SCHEMES[scheme].options if flat else options)
    if set(options) - set(known):
        bad = sorted(set(options) - set(known))[0]
        raise ConfigError(f"{where}: field 'distributed.options': unknown option '{bad}' of "
                          + (f"shard: {shard}" if shard != "none" else f"scheme '{scheme}'")
                          + f" (options: {listed(bad, known) if known else 'none'})")
    if flat and shard == "none":  # their values too: ssp's staleness -1 failed inside a rank
        SCHEMES[scheme].checked_options(options, f"{where}: field 'distributed.options' of "
                                                 f"scheme '{scheme}'")
    micro = _dimension(mapping, "micro_batches", where) or 1
    schedule = mapping.get("schedule", "gpipe")
    if schedule not in PIPELINE_SCHEDULES:
        raise ConfigError(f"{where}: field 'distributed.schedule' must be one of "
                          f"{', '.join(PIPELINE_SCHEDULES)}, got {schedule!r}")
    _refuse_unbuilt(dims, shard, scheme, name, where)
    return Spec(scheme, dict(options), name, params, max(1, int(mb * 2**20)), where,
                dims["data"], dims["pipeline"] or 1, dims["tensor"] or 1, shard, micro, schedule)


def _dimension(mapping: dict[str, Any], key: str, where: str) -> int | None:
    """The whole number >= 1 of field `distributed.<key>`, or None where it is not given."""
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: field 'distributed.{key}' must be a whole number >= 1, "
                          f"got {value!r}")
    return value


def _refuse_unbuilt(dims: dict[str, int | None], shard: str, scheme: str, compressor: str,
                    where: str) -> None:
    """A UsageError for what the dimensions declare but d500 cannot run yet, or that does not
    compose (a ZeRO stage with a scheme that moves whole models, or with compression)."""
    own = {DTENSOR: "tensor", PIPELINING: "pipeline"}.get(scheme)  # a baseline's dimension
    if own is not None:
        other = "pipeline" if own == "tensor" else "tensor"
        if (dims[own] or 1) < 2 or (dims[other] or 1) > 1 or shard != "none":
            raise UsageError(f"{where}: field 'distributed.scheme': the {scheme} baseline needs "
                             f"'distributed.{own}' >= 2 (one part per rank), {other}: 1 and "
                             f"shard: none (got {own} {dims[own] or 1}, {other} "
                             f"{dims[other] or 1}, shard {shard})")
    if (dims["tensor"] or 1) > 1 and scheme != DTENSOR and (
            scheme != "sync" or shard != "none" or compressor != "none"):
        raise UsageError(f"{where}: field 'distributed.tensor': tensor parallelism composes "
                         f"with the data dimension through scheme: sync, uncompressed, shard: "
                         f"none (got scheme '{scheme}', shard {shard}, compression "
                         f"{compressor})")
    if (dims["pipeline"] or 1) > 1 and scheme != PIPELINING and (
            scheme != "sync" or shard != "none" or compressor != "none"):
        raise UsageError(f"{where}: field 'distributed.pipeline': a pipeline's stages average "
                         f"their gradients over the data dimension with scheme: sync, "
                         f"uncompressed, shard: none (got scheme '{scheme}', shard {shard}, "
                         f"compression {compressor})")
    if shard != "none" and scheme not in SHARDABLE:
        raise UsageError(f"{where}: field 'distributed.shard': {shard} shards sync's update; "
                         f"scheme '{scheme}' moves whole models or runs its own (use scheme: "
                         f"sync, or shard: none)")
    if shard != "none" and compressor != "none":
        raise UsageError(f"{where}: field 'distributed.shard': {shard} reduce-scatters dense "
                         f"gradients; remove 'distributed.compression' or use shard: none")
