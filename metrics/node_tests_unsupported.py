"""node_tests_unsupported: ONNX node tests the backend refuses as unsupported, in one
`d500 conformance` run."""

NAME = "node_tests_unsupported"
UNIT = "tests"
DIRECTION = "lower"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = False  # a count of conformance tests, not timed
MEASURED = (
    "node tests whose model the backend rejects with d500's UnsupportedOperator (an operator, "
    "attribute or type it does not implement)"
)
