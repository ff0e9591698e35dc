"""staleness_max: the most updates a parameter server applied between a gradient's read and its
own application (level 3: async_ps, ssp)."""

NAME = "staleness_max"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = True  # how far ranks drift apart depends on their speeds
MEASURED = (
    "rank 0 (the server) records the staleness of every gradient it applies: async_ps the "
    "versions applied since the gradient's parameters were read, ssp the clocks missing from "
    "them; the maximum over the run (never above the entry's bound, which the server checks at "
    "each application; the histogram is in the run's details)"
)
