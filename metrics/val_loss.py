"""val_loss: the loss on the validation split."""

NAME = "val_loss"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "the mean loss over every sample of the validation split, in evaluation mode (no dropout, "
    "running batch-norm statistics), at an evaluation point"
)
