"""translate_time: time to load an ONNX model and translate it into a backend's executable."""

NAME = "translate_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around d500.model.load + Backend.prepare for one model, cold (the first "
    "prepare in the process)"
)
