"""compile_time: what a compiling mode (torch:compiled) spent making its program on the first call.

Part of first_call_time, recorded apart so that steady-state latency and compile cost are
never confused; a cached compile (a second process) is smaller, and the run says which."""

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
    "answer), inside the first Executable.run; the executable reports it (compile_time)"
)
