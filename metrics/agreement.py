"""agreement: how far a backend's network outputs are from the reference backend's."""

NAME = "agreement"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".2e"
MACHINE_DEPENDENT = False  # a numerical error against the reference on fixed inputs
MEASURED = (
    "the maximum relative error over all outputs and elements of the backend's outputs against "
    "the reference backend's"
)
