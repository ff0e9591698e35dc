"""steps: optimizer steps until the run stopped."""

NAME = "steps"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = float("inf")  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = False  # counted to the target, not timed
MEASURED = (
    "optimizer updates until the validation target was met; a run that missed counts as "
    "infinity"
)
