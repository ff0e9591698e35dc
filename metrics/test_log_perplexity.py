"""test_log_perplexity: a language model's mean next-token cross-entropy on the held-out test
documents that no decision ever reads."""

NAME = "test_log_perplexity"
UNIT = "nats"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".4f"
MACHINE_DEPENDENT = False  # a model's quality on fixed data, not timed
MEASURED = (
    "mean cross-entropy (natural log) of every next token of the test documents' windows at the "
    "evaluation where the validation target was first met (final_test_log_perplexity: at the end)"
)
