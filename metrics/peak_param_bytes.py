"""peak_param_bytes: the most parameter bytes one rank holds at once inside a step (level 3)."""

NAME = "peak_param_bytes"
UNIT = "B"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "bytes"  # 950 B, 207 kB, 1.5 MB (d500.metrics.format_bytes)
MACHINE_DEPENDENT = False  # counted from the arrays each rank holds, not timed
MEASURED = (
    "each ZeRO rank counts the parameter bytes its arrays hold right after each gather: ZeRO "
    "stages 1 and 2 hold the whole model, per-layer ZeRO-3 its rows of every parameter plus the "
    "layer it gathered; the maximum over ranks, recorded only where no rank claims less than the "
    "judge computes from its own copy of the graph (its rows and the largest layer)"
)
