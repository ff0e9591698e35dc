"""ONNX Gemm in C (gemm.c, the d500_operator.h ABI), float32 and float64, with backward."""

from __future__ import annotations

from d500.operators import CustomOperator


class CGemm(CustomOperator):
    op_type = "Gemm"
    framework = "c"
    source = "gemm.c"
    num_outputs = 1
