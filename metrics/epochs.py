"""epochs: epochs trained until the run stopped."""

NAME = "epochs"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = float("inf")  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3g"
MACHINE_DEPENDENT = False  # counted to the target, not timed
MEASURED = (
    "passes over the training split until the validation target was met (fractional when the "
    "evaluation cadence is in steps); a run that missed counts as infinity"
)
