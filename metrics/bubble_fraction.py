"""bubble_fraction: the share of a pipeline stage's step spent waiting for its neighbours
(level 3, pipeline > 1), measured; beside it, bubble_theory."""

NAME = "bubble_fraction"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3f"
MACHINE_DEPENDENT = True  # waiting depends on the stages' speeds and the network's latency
MEASURED = (
    "every stage times its waits for a neighbour (receiving an activation or a gradient, and the "
    "end of its sends) over the time of its pipeline passes in each step (the data allreduce and "
    "the update left out); the mean over the ranks (each rank's own in the run's details), as "
    "the ranks report it: the entry's code runs there; the judge records none whose mean is "
    "below 0.4 x its own (P-1)/(M+P-1), a wait no stages can have (distributed/figures.py)"
)
