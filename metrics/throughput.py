"""throughput: samples processed per second."""

NAME = "throughput"
UNIT = "samples/s"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ",.1f"
MACHINE_DEPENDENT = True  # a rate: the hardware sets it
MEASURED = (
    "batch size divided by the median latency of one call (inference or training step) in a run"
)
REPETITIONS = ("throughput",)  # run details: the timing of the repetitions
