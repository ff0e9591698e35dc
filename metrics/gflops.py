"""gflops: useful floating-point work per second, in GFLOP/s."""

NAME = "gflops"
UNIT = "GFLOP/s"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".2f"
MACHINE_DEPENDENT = True  # a rate: the hardware sets it
MEASURED = (
    "the operator's analytic FLOP count (not counting padding or redundant work) divided by its "
    "median latency, over 1e9"
)
