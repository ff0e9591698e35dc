"""compile_time: what a compiling mode (torch:compiled) spent making its program on the first call.

Level 1: part of first_call_time, recorded apart so that steady-state latency and compile cost
are never confused. Level 2: the worker's compile of its training step, on the clock (inside
time_to_accuracy, which the supervisor times), recorded apart as the worker reports it. A
compile that found its program in the cache under $D500_HOME is smaller: the run's detail
`compile.cache` says 'warm' (d500.training.compiling)."""

NAME = "compile_time"
UNIT = "s"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = "duration"
MACHINE_DEPENDENT = True  # a time: the hardware sets it
MEASURED = (
    "time.perf_counter around the static program's trace and torch.compile's first call "
    "(Dynamo, AOTAutograd, Inductor's code generation and C++ build, or their cache's "
    "answer), inside the first Executable.run (level 1) or the first training step (level 2: "
    "the worker's Trainer.compile_record); the executable or the worker reports it"
)
