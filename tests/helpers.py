"""Helpers shared by tests in several folders: the tiny level-1 workload (d500's MLP builder on
1x8x8 inputs) that the benchmark, summary, conformance and leaderboard tests measure."""

from __future__ import annotations

from collections.abc import Sequence

# every figure `d500 net bench` measures on a trainable model
BENCH_METRICS = ("train_step_time", "latency", "throughput", "translate_time", "first_call_time",
                 "agreement")


def tiny_mlp(name: str = "tiny-mlp", *, train: bool = False,
             metrics: Sequence[str] = ("latency", "throughput"), rank_by: str = "latency",
             batch_size: int = 16, budget: float = 0.05) -> str:
    """The text of a level-1 workload file: d500's MLP on 1x8x8 inputs at `batch_size`, each
    figure timed for `budget` seconds, `train` adding the training step."""
    return (f"name: {name}\nlevel: 1\nmodel:\n  builder: mlp\n  input_shape: [1, 8, 8]\n"
            f"batch_size: {batch_size}\ntrain: {'true' if train else 'false'}\n"
            f"budget: {budget:g}\nmetrics: [{', '.join(metrics)}]\nrank_by: {rank_by}\n")

