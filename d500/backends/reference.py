"""The NumPy reference backend: forward through onnx.reference.ReferenceEvaluator, NumPy backward.

Gradients walk the executed nodes in reverse and apply the vector-Jacobian product of each
operator from `d500.backends.reference_grad.VJP`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_hardmax import Hardmax as _Hardmax
from onnx.reference.ops.op_loop import Loop as _Loop
from onnx.reference.ops.op_softmax import Softmax as _Softmax

from d500.backends.base import Backend, Executable, to_numpy
from d500.errors import ModelError, UnsupportedOperator, UsageError


class Scatter(OpRun):
    """Scatter (opset 9-10, deprecated): ScatterElements without reduction."""

    op_domain = ""

    def _run(self, data, indices, updates, axis=None):  # type: ignore[override]
        from onnx.reference.ops.op_scatter_elements import scatter_elements
        return (scatter_elements(data, indices, updates, axis=axis or 0),)


class Optional(OpRun):
    """Optional: the value itself, None when empty (ReferenceEvaluator wraps it in a list)."""

    op_domain = ""

    def _run(self, x=None, type=None):  # type: ignore[override]
        return (x,)


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


class Softmax(_Softmax):
    """Softmax, coercing to 2-D before opset 13 as the spec says (ReferenceEvaluator does not)."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        return _coerced_2d(self, lambda v, a: _Softmax._run(self, v, axis=a), x, axis)


class LogSoftmax(_Softmax):
    """LogSoftmax, coerced to 2-D before opset 13 like Softmax."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        y = _coerced_2d(self, lambda v, a: _Softmax._run(self, v, axis=a), x, axis)[0]
        return (np.log(y),)


class Hardmax(_Hardmax):
    """Hardmax, coerced to 2-D before opset 13 like Softmax."""

    op_domain = ""

    def _run(self, x, axis=None):  # type: ignore[override]
        return _coerced_2d(self, lambda v, a: _Hardmax._run(self, v, axis=a), x, axis)


class BatchNormalization(OpRun):
    """BatchNormalization; before opset 14 a one-output node is inference (ReferenceEvaluator's
    BatchNormalization_9 uses batch statistics whenever momentum has its default)."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None,  # type: ignore[override]
             training_mode=None, **_: Any):
        from onnx.reference.ops.op_batch_normalization import (
            _batchnorm_test_mode,
            _batchnorm_training_mode,
        )
        opsets = self.run_params.get("opsets", {})
        opset = opsets.get("", opsets.get("ai.onnx", 14))
        n_out = len([o for o in self.onnx_node.output if o])
        epsilon = 1e-5 if epsilon is None else epsilon
        if (opset < 14 and n_out == 1) or (opset >= 14 and not training_mode):
            return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=epsilon),)
        res, saved_mean, saved_var, out_mean, out_var = _batchnorm_training_mode(
            x, scale, bias, mean, var, 0.9 if momentum is None else momentum, epsilon)
        # Before opset 14 the batch statistics are outputs 4 and 5.
        return (res, out_mean, out_var, saved_mean, saved_var)[:n_out]


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


EXTRA_OPS: list[type[OpRun]] = [Scatter, Optional, Loop, Softmax, LogSoftmax, Hardmax,
                                BatchNormalization, LRN]
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                onnx.TensorProto.BFLOAT16}


def _value(x: Any) -> Any:
    """An output as NumPy: arrays stay arrays, sequences lists, a missing optional None."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [_value(e) for e in x]
    if isinstance(x, dict):
        return x
    return np.asarray(x)


def _opset(model: onnx.ModelProto, domain: str) -> int:
    domain = "" if domain == "ai.onnx" else domain
    return next((o.version for o in model.opset_import
                 if (o.domain if o.domain != "ai.onnx" else "") == domain), 1)


def _culprit(model: onnx.ModelProto, err: Exception) -> UnsupportedOperator | None:
    """The node ReferenceEvaluator could not load, as an UnsupportedOperator."""
    from onnx.reference.ops import load_op
    local = {(f.domain, f.name) for f in model.functions}
    for node in model.graph.node:
        if (node.domain, node.op_type) in local:
            continue
        if node.domain not in ("", "ai.onnx"):
            if node.domain not in ("ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training",
                                   "experimental") or node.op_type in str(err):
                return UnsupportedOperator(node.op_type, node.domain, _opset(model, node.domain),
                                           node.name, "reference")
            continue
        try:
            load_op("", node.op_type, _opset(model, ""))
        except Exception:  # noqa: BLE001 - a context-dependent op may need types: ask the message
            if node.op_type in str(err):
                return UnsupportedOperator(node.op_type, node.domain, _opset(model, ""),
                                           node.name, "reference")
    return None


class ReferenceExecutable(Executable):
    backend_name = "reference"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        super().__init__(model, device)
        wanted = set(self.parameter_names)
        self._params = {t.name: to_numpy(t) for t in model.graph.initializer if t.name in wanted}
        self._backward: tuple[list[onnx.NodeProto], ReferenceEvaluator] | None = None
        try:
            self._evaluator = ReferenceEvaluator(model, new_ops=EXTRA_OPS)
        except Exception as err:  # ReferenceEvaluator raises untyped errors
            culprit = _culprit(model, err)
            if culprit is not None:
                raise culprit from None
            text = " ".join(str(err).split())[:300]
            raise ModelError(f"model '{model.graph.name}': the reference backend cannot prepare "
                             f"it: {type(err).__name__}: {text}") from err

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        feeds = self.bind(inputs)
        feeds.update({k: v for k, v in self._params.items() if k not in feeds})
        return feeds

    def run(self, inputs: Any, **kwargs: Any) -> list[Any]:
        return [_value(x) for x in self._evaluator.run(None, self._feeds(inputs))]

    def parameters(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._params.items()}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            if name not in self._params:
                raise UsageError(f"'{name}' is not a parameter of this model "
                                 f"(parameters: {', '.join(self._params) or 'none'})")
            old = self._params[name]
            value = np.asarray(value, dtype=old.dtype)
            if value.size != old.size:
                raise UsageError(f"parameter '{name}' has shape {old.shape}, "
                                 f"got a value of shape {value.shape}")
            self._params[name] = value.reshape(old.shape).copy()

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        from d500.backends.reference_grad import VJP, Step, attributes
        feeds = self._feeds(inputs)
        nodes, evaluator = self._backward_graph()
        values = evaluator.run(None, feeds, intermediate=True)
        outputs = [_value(values[n]) for n in self.output_names]
        float_inputs = [n for n in self.input_names
                        if n in feeds and np.asarray(feeds[n]).dtype.kind == "f"]
        targets = list(wrt) if wrt is not None else self.parameter_names + float_inputs
        unknown = [n for n in targets if n not in self._params and n not in feeds]
        if unknown:
            raise UsageError(f"cannot differentiate with respect to {unknown}: not a parameter "
                             f"or a given input of the model")
        grads: dict[str, np.ndarray] = {}
        for name, value in self._seeds(values, output, grad_outputs).items():
            grads[name] = value
        # Only nodes on a path from a target carry gradients back.
        live = set(targets)
        steps = []
        for node in nodes:
            if any(n in live for n in node.input if n):
                live.update(n for n in node.output if n)
                steps.append(node)
        for node in reversed(steps):
            g = [grads.get(n) if n else None for n in node.output]
            if all(x is None for x in g):
                continue
            vjp = VJP.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if vjp is None:
                raise UnsupportedOperator(node.op_type, node.domain,
                                          _opset(self.model, node.domain), node.name,
                                          "reference", "no gradient")
            step = Step(node, _opset(self.model, node.domain),
                        [values[n] if n else None for n in node.input],
                        [values.get(n) for n in node.output], attributes(node))
            for name, gin in zip(node.input, vjp(step, g)):
                if gin is None or not name or name not in live:
                    continue
                gin = np.asarray(gin)
                grads[name] = grads[name] + gin if name in grads else gin
        result = {}
        for name in targets:
            ref = self._params[name] if name in self._params else np.asarray(feeds[name])
            result[name] = (np.asarray(grads[name], dtype=ref.dtype).reshape(ref.shape)
                            if name in grads else np.zeros_like(ref))
        return outputs, result

    def _backward_graph(self) -> tuple[list[onnx.NodeProto], ReferenceEvaluator]:
        """The nodes the backward pass walks and their evaluator.

        A differentiable node whose operator has no VJP but is defined by an ONNX function
        (LayerNormalization, GroupNormalization, ...) is replaced by the function's nodes.
        """
        if self._backward is None:
            from d500.backends.reference_grad import VJP
            floats = set(self.parameter_names) | {
                i.name for i in self.model.graph.input
                if i.type.tensor_type.elem_type in _FLOAT_TYPES}
            nodes: list[onnx.NodeProto] = []
            for node in self.model.graph.node:
                nodes.extend(self._expand(node, floats, VJP, depth=0))
            if len(nodes) == len(self.model.graph.node):
                self._backward = (list(self.model.graph.node), self._evaluator)
            else:
                model = onnx.ModelProto()
                model.CopyFrom(self.model)
                model.graph.ClearField("node")
                model.graph.node.extend(nodes)
                self._backward = (nodes, ReferenceEvaluator(model, new_ops=EXTRA_OPS))
        return self._backward

    def _expand(self, node: onnx.NodeProto, floats: set[str], vjps: Mapping[str, Any],
                depth: int) -> list[onnx.NodeProto]:
        from types import SimpleNamespace

        from d500.backends.graph import Program, _inline
        differentiable = any(n in floats for n in node.input)
        if differentiable:
            floats.update(n for n in node.output if n)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not differentiable or (domain == "" and node.op_type in vjps) or depth > 4:
            return [node]
        types = {vi.name: vi.type for vi in (*self.model.graph.input, *self.model.graph.value_info)}
        types.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, t.dims)
                      for t in self.model.graph.initializer})
        opsets = {o.domain: o.version for o in self.model.opset_import}
        # Program._function_body reads only `functions` and `types` of its instance.
        lookup = SimpleNamespace(functions={(f.domain, f.name): f for f in self.model.functions},
                                 types=types)
        body = Program._function_body(lookup, node, domain, _opset(self.model, domain), opsets)
        if body is None:
            return [node]
        out = []
        for inner in _inline(node, body):
            out.extend(self._expand(inner, floats, vjps, depth + 1))
        return out

    def _seeds(self, values: Mapping[str, Any], output: str | None,
               grad_outputs: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """The gradients the backward pass starts from, by output name."""
        if grad_outputs is not None:
            seeds = {}
            for name, g in grad_outputs.items():
                if name not in self.output_names:
                    raise UsageError(f"'{name}' is not an output of the model "
                                     f"(outputs: {', '.join(self.output_names)})")
                y = np.asarray(values[name])
                g = np.asarray(g, dtype=y.dtype)
                if g.shape != y.shape:
                    raise UsageError(f"gradient for output '{name}' has shape {g.shape}, "
                                     f"the output has shape {y.shape}")
                seeds[name] = g
            return seeds
        name = output or self.output_names[0]
        if name not in self.output_names:
            raise UsageError(f"'{name}' is not an output of the model "
                             f"(outputs: {', '.join(self.output_names)})")
        y = np.asarray(values[name])
        return {name: np.ones_like(y)}

    @property
    def native(self) -> ReferenceEvaluator:
        return self._evaluator


class ReferenceBackend(Backend):
    name = "reference"
    framework = "onnx"

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return ReferenceExecutable(model, device)
