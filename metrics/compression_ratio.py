"""compression_ratio: dense gradient bytes over the bytes a compressor sent (level 3)."""

NAME = "compression_ratio"
UNIT = "x"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4g"
MACHINE_DEPENDENT = False  # a ratio of byte counts, not timed
MEASURED = (
    "bytes of the dense float32 gradients over the payload bytes the compressor put on the wire "
    "(values, indices, scales, norms), summed over steps and ranks; > 1 means fewer bytes"
)
