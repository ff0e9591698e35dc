"""val_accuracy: accuracy on the validation split (the one the stopping rule reads)."""

NAME = "val_accuracy"
UNIT = ""
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4f"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "fraction of correctly classified samples of the validation split at the end of the run (or "
    "when the target was met)"
)
