"""comm_share: the share of training-step time spent communicating (level 3)."""

NAME = "comm_share"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3f"
MACHINE_DEPENDENT = True  # a ratio of times: the interconnect and the cores set it
MEASURED = (
    "comm_time / (comm_time + compute_time), summed over every rank: 0 = no communication, "
    "1 = nothing but"
)
