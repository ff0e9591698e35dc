"""latency: wall time of one call of the measured operator or network."""

NAME = "latency"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around one call, repeated after warm-up; the median of the timed "
    "repetitions of a run"
)
REPETITIONS = ("latency", "timing")  # run details with its repetitions: level 1, level 0
