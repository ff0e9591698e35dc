"""train_step_time: wall time of one training step (forward, backward, update)."""

NAME = "train_step_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around one full step on a fixed batch, repeated after warm-up; the "
    "median of the timed repetitions"
)
REPETITIONS = ("train_step",)  # run details: the timing of the repetitions
