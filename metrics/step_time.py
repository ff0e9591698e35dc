"""step_time: wall time of one distributed training step (level 3)."""

NAME = "step_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "wall time of one scheme step on one rank (forward, backward, communication, update), mean "
    "over the run's steps and over ranks"
)
