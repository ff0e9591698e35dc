"""bytes_received_per_step: bytes one rank receives per training step (level 3)."""

NAME = "bytes_received_per_step"
UNIT = "B"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = False  # counted from the collectives' algorithms, not timed
MEASURED = (
    "bytes this rank received per training step, counted like bytes_per_step; the mean over "
    "ranks"
)
