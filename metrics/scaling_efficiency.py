"""scaling_efficiency: (ref * T_ref) / (N * T_N), the same entry at the reference size (level 3)."""

NAME = "scaling_efficiency"
UNIT = ""
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3f"
MACHINE_DEPENDENT = True  # a ratio of times: the cores and the interconnect set it
MEASURED = (
    "the workload's reference world size times the median time to accuracy of the same entry's "
    "succeeded runs at that size (same workload rules and backend), over N times this run's "
    "time to accuracy: 1 = perfect strong scaling; not reported without a reference run or when "
    "the target was missed"
)
