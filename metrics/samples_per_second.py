"""samples_per_second: training throughput."""

NAME = "samples_per_second"
UNIT = "samples/s"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = True  # a rate: the hardware sets it
MEASURED = (
    "training samples processed per second of training-step time (forward, backward and update;"
    " data loading and evaluation excluded)"
)
