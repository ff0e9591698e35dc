"""node_tests_total: ONNX node tests run in one `d500 conformance` run."""

NAME = "node_tests_total"
UNIT = "tests"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = False  # a count of conformance tests, not timed
MEASURED = (
    "every deterministic node test of the installed onnx (a complete run), or those of the --op "
    "operators (a partial run, never counted as the backend's conformance)"
)
