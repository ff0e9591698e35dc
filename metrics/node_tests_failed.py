"""node_tests_failed: ONNX node tests the backend runs and gets wrong, in one `d500 conformance`
run."""

NAME = "node_tests_failed"
UNIT = "tests"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = False  # a count of conformance tests, not timed
MEASURED = (
    "node tests whose outputs differ from the expected ones beyond the test's rtol/atol, or whose "
    "run raised an error other than an unsupported operator"
)
