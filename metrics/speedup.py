"""speedup: T_ref / T_N, the same entry at the workload's reference world size (level 3)."""

NAME = "speedup"
UNIT = "x"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3g"
MACHINE_DEPENDENT = True  # a ratio of times: the cores and the interconnect set it
MEASURED = (
    "the median time to accuracy of the same entry's succeeded runs at the workload's "
    "reference world size over this run's"
)
