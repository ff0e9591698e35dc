"""time_to_accuracy: wall time from the start of the run until the validation target is met."""

NAME = "time_to_accuracy"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = float("inf")  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "wall time from run_start (data loading and evaluation included) to the evaluation that "
    "first met the workload's validation target; a run that misses the target, diverges or "
    "fails counts as infinity"
)
