"""bubble_theory: the idle share of a pipeline step in theory, (P-1)/(M+P-1) for P equal stages
and M micro-batches (GPipe and 1F1B alike), beside the measured bubble_fraction."""

NAME = "bubble_theory"
UNIT = ""
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".3f"
MACHINE_DEPENDENT = False  # the entry's P and M alone
MEASURED = "(P-1)/(M+P-1) from the entry's pipeline stages P and micro-batches M (not measured)"
