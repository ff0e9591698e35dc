"""comm_time: time in communication during training (level 3)."""

NAME = "comm_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "seconds one rank spent inside the communicator's collectives during training steps (waiting "
    "for slower ranks included), summed over the run; the mean over ranks. Not reported for "
    "torch DDP, which overlaps its allreduces with the backward pass"
)
