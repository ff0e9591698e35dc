"""train_loss: the training loss (the objective the optimizer minimises), averaged over an epoch."""

NAME = "train_loss"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "the mean of the per-batch training losses since the previous evaluation, as the trainer "
    "computed them for the updates (no extra forward pass)"
)
