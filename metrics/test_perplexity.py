"""test_perplexity: exp(test_log_perplexity), the test documents' perplexity per token."""

NAME = "test_perplexity"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".2f"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "exp of the mean next-token cross-entropy on the test documents at the evaluation where the "
    "validation target was first met (per token of the workload's byte-level BPE)"
)
