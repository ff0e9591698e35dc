"""What d500 knows about the NumPy reference without importing it: its packages, threads, hooks."""

from __future__ import annotations

from d500.backends.hooks import Framework


class Reference(Framework):
    """NumPy's BLAS: its threads are threads.configure()'s last step, for every framework."""

    def set_threads(self, n: int) -> None:
        from d500 import threads
        threads.blas(n)

    def reports_threads(self) -> bool:
        return False  # threads.actual() reports the BLAS libraries themselves


FRAMEWORK = Reference(
    "reference", module="numpy", distribution="numpy",
    optimizer_ops="d500.backends.reference.optimizer_ops",
    backward="d500.backends.reference.operators:backward",
    operator_runner="d500.operators.adapters:Runner",  # NumPy in, NumPy out
    threads_when_loaded=False, tie_rank=0,  # BLAS is set last by threads.configure, always
    about=("NumPy: onnx.reference.ReferenceEvaluator forward, NumPy backward; the baseline "
           "others are judged against"))
