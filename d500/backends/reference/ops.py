"""The reference backend's forward op table: onnx.reference OpRun classes that add an operator
ReferenceEvaluator lacks or replace one whose result departs from the ONNX specification."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_hardmax import Hardmax as _Hardmax
from onnx.reference.ops.op_loop import Loop as _Loop
from onnx.reference.ops.op_softmax import Softmax as _Softmax

from d500.backends.graph import registry

OPS, op = registry()


@op
class Scatter(OpRun):
    """Scatter (opset 9-10, deprecated): ScatterElements without reduction."""

    op_domain = ""

    def _run(self, data, indices, updates, axis=None):  # type: ignore[override]
        from onnx.reference.ops.op_scatter_elements import scatter_elements
        return (scatter_elements(data, indices, updates, axis=axis or 0),)


@op
class Optional(OpRun):
    """Optional: the value itself, None when empty (ReferenceEvaluator wraps it in a list)."""

    op_domain = ""

    def _run(self, x=None, type=None):  # type: ignore[override]
        return (x,)


@op
class Loop(_Loop):
    """Loop whose scan outputs stack the per-iteration values on a new first axis.

    ReferenceEvaluator's Loop uses np.vstack, which turns scalars into [n, 1] and merges the
    first axis of n-d values; ONNX specifies a new axis.
    """

    op_domain = ""

    def _run(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        k = self.K
        if k == 0:
            return super()._run(*args, **kwargs)
        scans: list[list[Any]] = []
        run_body = self._run_body

        def body(*a: Any, **kw: Any) -> Any:
            out = run_body(*a, **kw)
            scans.append(list(out[-k:]))
            return out

        self._run_body, self.K = body, 0  # type: ignore[method-assign]
        try:
            carried = list(super()._run(*args, **kwargs))[:len(self.onnx_node.output) - k]
        finally:
            del self._run_body
            self.K = k
        stacked = [np.stack([s[i] for s in scans]) if scans else np.empty((0,), np.float32)
                   for i in range(k)]
        return tuple(carried + stacked)


def _coerced_2d(op: OpRun, run: Any, x: np.ndarray, axis: int | None) -> tuple[np.ndarray]:
    """Before opset 13, Softmax/LogSoftmax/Hardmax see the input flattened to 2-D at `axis`."""
    opsets = op.run_params.get("opsets", {})
    old = opsets.get("", opsets.get("ai.onnx", 13)) < 13
    if axis is None:  # op.axis holds the newest schema's default (-1); before opset 13 it was 1
        given = any(a.name == "axis" for a in op.onnx_node.attribute)
        axis = op.axis if given or not old else 1  # type: ignore[attr-defined]
    if old and x.ndim > 2:
        a = axis % x.ndim
        flat = x.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), -1)
        return (run(flat, 1)[0].reshape(x.shape),)
    return run(x, axis)


def _in_float32(x: np.ndarray, run: Any) -> tuple[np.ndarray]:
    """`run(x)` on bfloat16 computed in float32 and rounded once, as frameworks accumulate it
    (NumPy sums a bfloat16 array in bfloat16: a softmax's 128-term sum came out 4 % off, and
    the reference failed its own bf16 case). float16 stays as NumPy computes it, which the ONNX
    node suite's fp16 outputs were made with."""
    if x.dtype != ml_dtypes.bfloat16:
        return run(x)
    return tuple(np.asarray(y).astype(x.dtype) for y in run(x.astype(np.float32)))


@op
class Softmax(_Softmax):
    """Softmax, coercing to 2-D before opset 13 as the spec says (ReferenceEvaluator does not)."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        return _in_float32(x, lambda w: _coerced_2d(
            self, lambda v, a: _Softmax._run(self, v, axis=a), w, axis))


@op
class LogSoftmax(_Softmax):
    """LogSoftmax, coerced to 2-D before opset 13 like Softmax."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        return _in_float32(x, lambda w: (np.log(_coerced_2d(
            self, lambda v, a: _Softmax._run(self, v, axis=a), w, axis)[0]),))


@op
class Hardmax(_Hardmax):
    """Hardmax, coerced to 2-D before opset 13 like Softmax."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        return _coerced_2d(self, lambda v, a: _Hardmax._run(self, v, axis=a), x, axis)


@op
class BatchNormalization(OpRun):
    """BatchNormalization; before opset 14 a one-output node is inference (ReferenceEvaluator's
    BatchNormalization_9 uses batch statistics whenever momentum has its default); BN-7's
    spatial=0 (ignored by ReferenceEvaluator) normalises per activation."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None,  # type: ignore[override]
             training_mode=None, spatial=None, **_: Any):
        from onnx.reference.ops.op_batch_normalization import (
            _batchnorm_test_mode,
            _batchnorm_training_mode,
        )
        opsets = self.run_params.get("opsets", {})
        opset = opsets.get("", opsets.get("ai.onnx", 14))
        if opset < 9 and spatial == 0:
            # scale, B, mean and var are (C, D1, ..., Dn), statistics over the batch axis only:
            # the batch norm of x flattened to (N, C*D1*...*Dn), as BN-9's documentation says
            flat = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))
            out = self._run(flat, *(v.reshape(-1) for v in (scale, bias, mean, var)),
                            epsilon=epsilon, momentum=momentum, training_mode=training_mode)
            return (out[0].reshape(x.shape), *(v.reshape(mean.shape) for v in out[1:]))
        n_out = len([o for o in self.onnx_node.output if o])
        epsilon = 1e-5 if epsilon is None else epsilon
        if (opset < 14 and n_out == 1) or (opset >= 14 and not training_mode):
            return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=epsilon),)
        res, saved_mean, saved_var, out_mean, out_var = _batchnorm_training_mode(
            x, scale, bias, mean, var, 0.9 if momentum is None else momentum, epsilon)
        # Before opset 14 the batch statistics are outputs 4 and 5.
        return (res, out_mean, out_var, saved_mean, saved_var)[:n_out]


@op
class LRN(OpRun):
    """LRN over the channel axis (ReferenceEvaluator's loops over the batch axis instead)."""

    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):  # type: ignore[override]
        alpha = 1e-4 if alpha is None else alpha
        beta = 0.75 if beta is None else beta
        bias = 1.0 if bias is None else bias
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        square = x.astype(np.float64) ** 2
        total = np.zeros_like(square)
        for c in range(x.shape[1]):
            total[:, c] = square[:, max(0, c - before):c + after + 1].sum(axis=1)
        return ((x / (bias + alpha / size * total) ** beta).astype(x.dtype),)
