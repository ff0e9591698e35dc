"""The reference backend: forward through onnx.reference.ReferenceEvaluator (with the op fixes of
`ops`), backward by walking the executed nodes in reverse through the NumPy VJP table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from d500.backends.base import Backend, Executable, to_numpy
from d500.backends.reference import math, nn, reduce, shape
from d500.backends.reference.framework import FRAMEWORK
from d500.backends.reference.ops import OPS
from d500.backends.reference.table import Step, attributes
from d500.backends.trainer_base import Trainer
from d500.errors import ModelError, UnsupportedOperator, UsageError

# The VJP table: ONNX op type (default domain) -> its vector-Jacobian product.
VJP = {**math.VJP, **nn.VJP, **reduce.VJP, **shape.VJP}
_FORWARD = list(OPS.values())
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
            self._evaluator = ReferenceEvaluator(model, new_ops=_FORWARD)
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
            old = self._params.get(name)
            self._params[name] = self.parameter_value(name, value, old).astype(old.dtype)

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        bound = self.bind(inputs)
        targets = self.gradient_targets(bound, wrt)
        for name in grad_outputs or [output or self.output_names[0]]:
            self.output_index(name)
        feeds = self._feeds(bound)
        nodes, evaluator = self._backward_graph()
        values = evaluator.run(None, feeds, intermediate=True)
        outputs = [_value(values[n]) for n in self.output_names]
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
                self._backward = (nodes, ReferenceEvaluator(model, new_ops=_FORWARD))
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
                y = np.asarray(values[name])
                g = np.asarray(g, dtype=y.dtype)
                if g.shape != y.shape:
                    raise UsageError(f"gradient for output '{name}' has shape {g.shape}, "
                                     f"the output has shape {y.shape}")
                seeds[name] = g
            return seeds
        name = output or self.output_names[0]
        y = np.asarray(values[name])
        return {name: np.ones_like(y)}

    @property
    def native(self) -> ReferenceEvaluator:
        return self._evaluator

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Trainer:
        from d500.backends.reference.trainer import ReferenceTrainer
        self.check_precision(precision)
        return ReferenceTrainer(self, optimizer, loss, native)


class ReferenceBackend(Backend):
    name = "reference"
    about = FRAMEWORK.about

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return ReferenceExecutable(model, device)
