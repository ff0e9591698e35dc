"""A level-3 entry's `distributed:` mapping (in its submission.yaml), validated: the scheme and its
options, the gradient compressor and its parameters, the tensor-fusion bucket size.

    distributed:
      scheme: sync                 # one of d500's schemes (d500.distributed.schemes) or ddp
      options: {}                  # the scheme's own options (e.g. local_sgd's period)
      compression: {name: topk, density: 0.01}   # a compressor and its parameters (default none)
      bucket_mb: 25                # tensor fusion: bytes per bucket in MiB (torch DDP's default)

`ddp` is torch's DistributedDataParallel (gloo), the native baseline: it takes no compression
and runs on the torch backend only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, UsageError

NATIVE = "ddp"  # torch DistributedDataParallel, d500.distributed.ddp
DEFAULT_BUCKET_MB = 25.0
KEYS = ("scheme", "options", "compression", "bucket_mb")
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

    @property
    def native(self) -> bool:
        return self.scheme == NATIVE

    @property
    def comm_precision(self) -> str:
        """The lowest precision of what crosses the wire (MLLOG's key)."""
        return PRECISION.get(self.compressor, "fp32")

    def logged(self) -> dict[str, Any]:
        """The choices as run hyperparameters (ledger and MLLOG)."""
        out: dict[str, Any] = {"scheme": self.scheme, "compressor": self.compressor,
                               "bucket_bytes": self.bucket_bytes}
        out.update({f"scheme_{k}": v for k, v in self.options.items()})
        out.update({f"compressor_{k}": v for k, v in self.compression.items()})
        return out


def known_schemes() -> list[str]:
    """d500's schemes and the native baseline."""
    from d500.distributed.schemes import SCHEMES
    return [*SCHEMES, NATIVE]


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
                          f"{', '.join(KEYS)})")
    scheme = mapping.get("scheme")
    if not isinstance(scheme, str):
        raise ConfigError(f"{where}: field 'distributed.scheme' must name a scheme (known: "
                          f"{', '.join(known_schemes())})")
    if scheme not in known_schemes():
        raise UsageError(f"{where}: field 'distributed.scheme': unknown scheme '{scheme}' "
                         f"(known: {', '.join(known_schemes())})")
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
    if scheme == NATIVE and name != "none":
        raise ConfigError(f"{where}: field 'distributed.compression': the ddp baseline runs "
                          f"torch's own allreduce uncompressed; compress with a d500 scheme")
    from d500.distributed import compression as compressors
    compressors.make(name, params, where=f"{where}: field 'distributed.compression'")
    mb = mapping.get("bucket_mb", DEFAULT_BUCKET_MB)
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not (
            math.isfinite(mb) and mb > 0):
        raise ConfigError(f"{where}: field 'distributed.bucket_mb' must be a positive number "
                          f"of MiB, got {mb!r}")
    return Spec(scheme, dict(options), name, params, max(1, int(mb * 2**20)), where)
