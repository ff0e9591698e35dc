"""test_accuracy: accuracy on the held-out test split that no decision ever reads."""

NAME = "test_accuracy"
UNIT = ""
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4f"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "fraction of correctly classified samples of the held-out test split at the evaluation where "
    "the validation target was first met (final_test_accuracy: at the end); no decision reads it"
)
