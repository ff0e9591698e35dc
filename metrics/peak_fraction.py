"""peak_fraction: achieved FLOP/s as a percentage of the machine's measured peak FLOP/s."""

NAME = "peak_fraction"
UNIT = "%"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".1f"
MACHINE_DEPENDENT = True  # a share of this machine's peak: its vector units and caches set it
MEASURED = (
    "gflops divided by the peak FLOP/s d500.provenance.peak_flops() measured on the same "
    "machine (a calibrated float32 GEMM), times 100"
)
