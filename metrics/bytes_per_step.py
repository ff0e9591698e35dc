"""bytes_per_step: bytes one rank sends per training step (level 3)."""

NAME = "bytes_per_step"
UNIT = "B"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = False  # counted from the collectives' algorithms, not timed
MEASURED = (
    "bytes this rank passed to the network per training step, counted by the communicator from "
    "each collective's algorithm (MPI Allreduce as the ring: 2(N-1)/N of the buffer; d500's "
    "ring and neighbour exchange: what they actually send), never read from the network "
    "interface; the mean over ranks (every rank's own in the run's details)"
)
