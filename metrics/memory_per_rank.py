"""memory_per_rank: the most bytes of parameters, gradients and optimizer state one rank holds
(level 3)."""

NAME = "memory_per_rank"
UNIT = "B"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "bytes"  # 950 B, 207 kB, 1.5 MB (d500.metrics.format_bytes)
MACHINE_DEPENDENT = False  # counted from the arrays each rank holds, not timed
MEASURED = (
    "each rank's scheme counts the bytes it holds across a step's update: its parameters, its "
    "gradients (a whole gradient for the data-parallel schemes, the averaged block for ZeRO "
    "stage 2) and its optimizer state as allocated (for ZeRO, its block's slots only); the "
    "maximum over ranks (every rank's own in the run's details: scheme). Activations and the "
    "backward pass's transient gradient are not counted"
)
