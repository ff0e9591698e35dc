"""first_call_time: the first run of a freshly translated network.

Tracing, JIT compilation and lazy set-up included."""

NAME = "first_call_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around the first Executable.run at batch 1 right after Backend.prepare: "
    "what a user waits for on top of translate_time before the first answer (tf.function "
    "tracing, lazy kernel selection, caches)"
)
