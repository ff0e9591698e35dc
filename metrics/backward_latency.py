"""backward_latency: wall time of one backward pass of the measured operator."""

NAME = "backward_latency"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around one backward call given the forward's saved state (the "
    "operator's backward; torch autograd.grad with the graph retained; a persistent tensorflow "
    "GradientTape's gradient; the NumPy reference's VJP), repeated after warm-up; the median "
    "of the timed repetitions of a run, timed interleaved with the forward"
)
REPETITIONS = ("backward_timing",)  # run details: the timing of the repetitions
