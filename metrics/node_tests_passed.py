"""node_tests_passed: ONNX node tests the backend passes in one `d500 conformance` run."""

NAME = "node_tests_passed"
UNIT = "tests"
DIRECTION = "higher"  # which way is better: "lower" or "higher"
AGGREGATE = "median"  # over repetitions and seeds (a workload may ask for olympic_mean)
MISSING = None  # what a run that did not record this metric counts as (None: not counted)
FORMAT = ".0f"
MACHINE_DEPENDENT = False  # a count of conformance tests, not timed
MEASURED = (
    "the official ONNX node tests (onnx.backend.test of the installed onnx, the 12 random-output "
    "tests left out) whose outputs the backend reproduces within each test's own rtol/atol, "
    "compared as onnx.backend.test.BackendTest compares them"
)
