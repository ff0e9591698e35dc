"""compute_time: time in computation during training (level 3)."""

NAME = "compute_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "training-step time minus comm_time on one rank (forward, backward, compression, update), "
    "summed over the run; the mean over ranks"
)
