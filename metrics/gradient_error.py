"""gradient_error: how far an implementation's gradients are from the reference gradients."""

NAME = "gradient_error"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".2e"
MACHINE_DEPENDENT = False  # a numerical error against the reference on fixed inputs
MEASURED = (
    "the maximum relative error of the gradients (w.r.t. every input and parameter) against the "
    "reference backward pass on the same upstream gradient"
)
