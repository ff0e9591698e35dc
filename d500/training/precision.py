"""Mixed precision as a recipe field: the precisions, their MLLOG names, the checks a run passes
before it is recorded, the CPU's native bf16, and fp16's dynamic loss scale.

    allowed("bf16", workload)              # the workload's rules: a ConfigError naming it
    check_backend("bf16", backend_cls)     # the backend on its device: a UsageError
    scale = LossScale()                    # fp16: multiply the loss by scale.value, then
    skip = scale.update(found_inf)         # skip the update on inf/nan gradients, grow/back off

A precision is the dtype the linear layers (MatMul, Gemm, Conv: MLPerf's
lowest_numerical_precision_in_linear, attention's matmuls included) compute in. Master weights,
gradients and the optimizer state stay float32 on every backend: torch's autocast casts a
float32 parameter to the lower dtype inside the op, so its gradient comes back float32; the
TensorFlow trainer casts the inputs of those ops only. The judge evaluates in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, UsageError

PRECISIONS = ("fp32", "bf16", "fp16")  # from the highest to the lowest a workload may allow
DEFAULT = "fp32"
MLLOG = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "fp16"}  # MLPerf's names (6.1 checker)
# How far a bf16 run's training losses may lie from float32's over its first steps, as a share of
# the first step's loss (the problem's scale: a relative bound on each step would blow up as the
# loss nears 0): bf16 keeps 8 bits of mantissa (2**-9 = 0.2 % rounding per value), a matmul of
# width 64-128 sums a few hundred such errors, and SGD carries them from step to step. Measured
# (tests/training/test_precision.py, benchmarks/gpu_check.py): digits-mlp, 10 steps, torch 0.2 %
# and TensorFlow 0.3 %; 49 steps on torch 0.6 % (fp16 0.4 %); a text-lm-shaped transformer, 29
# steps, < 0.1 %.
# 2 % leaves room for other seeds and shapes and still fails a run whose loss is off by a
# factor (a float16 overflow, a cast dropped from the backward).
BF16_LOSS_RTOL = 0.02


def loss_gap(low: Any, fp32: Any) -> float:
    """The largest difference of two runs' step losses, as a share of fp32's first loss."""
    import numpy as np
    a, b = np.asarray(low, np.float64), np.asarray(fp32, np.float64)
    return float(np.max(np.abs(a - b)) / abs(b[0]))
# The ONNX operators a precision applies to (MLPerf's "linear": matmuls and convolutions,
# attention's among them); torch's autocast picks the same ones by itself, the TensorFlow trainer
# casts the inputs of these and computes the rest in float32.
LINEAR_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic


def parse(value: Any, where: str) -> str:
    """`value` as a precision name; anything else is a ConfigError naming `where`."""
    if value not in PRECISIONS:
        raise ConfigError(f"{where}: precision '{value}' is not one of {', '.join(PRECISIONS)}")
    return str(value)


def precision_of(run: Any) -> str:
    """The precision a ledger run (a row dict, or anything with `hyperparameters`) trained in:
    its recipe's, recorded among its hyperparameters only when not fp32."""
    hyper = run.get("hyperparameters") if isinstance(run, dict) else getattr(
        run, "hyperparameters", None)
    return str((hyper or {}).get("precision", DEFAULT))


def lower(a: str, b: str) -> bool:
    """Whether precision `a` is lower than `b`."""
    return PRECISIONS.index(a) > PRECISIONS.index(b)


def allowed(precision: str, workload: Any, where: str = "recipe") -> None:
    """A ConfigError naming `where` (the recipe's file) unless the workload's rules allow
    `precision` (its `lowest_precision`, fp32 unless it says)."""
    parse(precision, where)
    lowest = getattr(workload, "lowest_precision", DEFAULT)
    if lower(precision, lowest):
        raise ConfigError(f"{where}: precision {precision} is lower than workload "
                          f"'{workload.name}' allows (its lowest_precision is {lowest})")


def check_backend(precision: str, backend_cls: Any, device: str = "CPU") -> None:
    """A UsageError naming the backend when it cannot train in `precision` on `device`."""
    if precision not in PRECISIONS:
        raise UsageError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}")
    runs = backend_cls.precisions(device)
    if precision not in runs:
        why = ": fp16 needs a CUDA device (loss scaling on GPU)" if precision == "fp16" else ""
        raise UsageError(f"backend '{backend_cls.name}' cannot train in {precision} on "
                         f"{device} (it trains in {', '.join(runs)}){why}")


def cpu_flags(cpuinfo: str | None = None) -> dict[str, bool]:
    """Whether this CPU has native bf16 arithmetic: each of CPU_BF16_FLAGS in /proc/cpuinfo
    (all False where there is none: bf16 then runs emulated, slower than float32)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
            break
    return {f: f in flags for f in CPU_BF16_FLAGS}


@dataclass
class LossScale:
    """fp16's dynamic loss scale with torch.amp.GradScaler's rules: the loss is multiplied by
    `value` before the backward; a step whose gradients hold inf or nan is skipped and the
    scale multiplied by `backoff`; after `interval` clean steps in a row it grows by `growth`.
    `history` holds (step, value) at every change."""

    value: float = 2.0 ** 16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000
    clean: int = 0
    steps: int = 0
    skipped: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)

    def update(self, found_inf: bool) -> bool:
        """Account one step; True when its update must be skipped (found_inf)."""
        self.steps += 1
        if found_inf:
            self.skipped += 1
            self.clean = 0
            self.value *= self.backoff
            self.history.append((self.steps, self.value))
            return True
        self.clean += 1
        if self.clean >= self.interval:
            self.clean = 0
            self.value *= self.growth
            self.history.append((self.steps, self.value))
        return False
