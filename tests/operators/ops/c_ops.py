"""C test operators: a correct Relu, a Relu off by 1e-3 on negatives, one that does not compile."""

from __future__ import annotations

from d500.operators import CustomOperator


class CRelu(CustomOperator):
    op_type = "Relu"
    framework = "c"
    source = "relu.c"


class LeakyCRelu(CustomOperator):
    op_type = "Relu"
    framework = "c"
    source = "relu_leaky.c"


class BrokenBuild(CustomOperator):
    op_type = "Relu"
    framework = "c"
    source = "does_not_compile.c"
