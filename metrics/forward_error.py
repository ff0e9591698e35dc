"""forward_error: how far an implementation's forward outputs are from the ONNX reference."""

NAME = "forward_error"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".2e"
MACHINE_DEPENDENT = False  # a numerical error against the reference on fixed inputs
MEASURED = (
    "the maximum relative error of the forward pass against the NumPy reference on the "
    "workload's fixed inputs"
)
