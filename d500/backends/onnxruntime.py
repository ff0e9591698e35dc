"""onnxruntime as an inference-only peer backend, for comparison, in two modes: `onnxruntime`
(its full graph optimization, ORT_ENABLE_ALL: onnxruntime's own default) and
`onnxruntime:basic` (ORT_ENABLE_BASIC: constant folding and redundant-node elimination, no node
fusions or layout changes), which shows what the fusions are worth.

onnxruntime refuses models whose IR version or default-domain opset is newer than it knows,
even when every operator they use is unchanged since an opset it does know. Such models are
handed to it with the IR version and opset lowered as far as their operators allow.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import onnx.defs

from d500 import threads
from d500.backends.base import Backend, Executable, InferenceOnly
from d500.backends.hooks import Framework
from d500.errors import ModelError, UnsupportedOperator

_IR = re.compile(r"Unsupported model IR version: \d+, max supported IR version: (\d+)")
_OPSET = re.compile(r"official support for domain (ai\.onnx|\S*) is till opset (\d+)")
_MISSING = re.compile(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_UNREGISTERED = re.compile(r"(\S*):(\w+)\((-?\d+)\) is not a registered function/op")


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            for g in a.graphs:
                yield from _graphs(g)


def lowest_opset(model: onnx.ModelProto) -> int:
    """The oldest default-domain opset at which every operator of the model has its schema."""
    declared = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    needed = 1
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            try:
                needed = max(needed, onnx.defs.get_schema(node.op_type, declared).since_version)
            except onnx.defs.SchemaError:
                return declared
    return needed


def _lowered(model: onnx.ModelProto, ir: int | None, opset: int | None) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if ir is not None:
        copy.ir_version = min(copy.ir_version, ir)
    if opset is not None:
        for imp in copy.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = min(imp.version, opset)
    return copy


def _as_input(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_as_input(v) for v in x]
    return x if x is None or isinstance(x, dict) else np.asarray(x)


def _as_output(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_as_output(v) for v in x]
    return x if x is None or isinstance(x, dict) else np.asarray(x)


class OnnxRuntime(Framework):
    """Each session gets threads.recorded()'s count as it is made."""

    def reports_threads(self) -> bool:
        return True  # the count its sessions get, loaded or not


FRAMEWORK = OnnxRuntime(
    "onnxruntime", module="onnxruntime", distribution="onnxruntime", tie_rank=1,
    about="its full graph optimization (ORT_ENABLE_ALL: node fusions, layout changes); "
          "inference only",
    modes={"basic": "basic graph optimization only (ORT_ENABLE_BASIC: constant folding, "
                    "redundant nodes removed, no fusions); inference only"})

# mode -> onnxruntime's graph optimization level (a GraphOptimizationLevel member's name)
OPTIMIZATION = {"": "ORT_ENABLE_ALL", "basic": "ORT_ENABLE_BASIC"}


class OnnxRuntimeExecutable(InferenceOnly):
    backend_name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", mode: str = ""):
        super().__init__(model, device)
        self.optimization = OPTIMIZATION[mode]
        self._session = self._open(model, device)

    def _open(self, model: onnx.ModelProto, device: str) -> Any:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization)
        # Idle worker threads must not spin: d500 interleaves backends in one process, and a
        # spinning pool would steal the cores of whichever backend is timed next.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        threads.session_options(options)  # the one count every framework gets (--threads)
        providers = (["CUDAExecutionProvider"] if device.upper().startswith("CUDA") else []) + [
            "CPUExecutionProvider"]
        ir = opset = None
        for _ in range(3):
            candidate = _lowered(model, ir, opset) if (ir or opset) else model
            try:
                return ort.InferenceSession(candidate.SerializeToString(), options,
                                            providers=providers)
            except Exception as err:  # noqa: BLE001 - onnxruntime raises its own untyped errors
                text = str(err)
                if (m := _IR.search(text)) and ir is None:
                    ir = int(m.group(1))
                    continue
                if (m := _OPSET.search(text)) and opset is None and m.group(1) in ("ai.onnx", ""):
                    supported, needed = int(m.group(2)), lowest_opset(model)
                    if needed <= supported:
                        opset = supported
                        continue
                    raise ModelError(
                        f"model '{model.graph.name}': onnxruntime {ort.__version__} knows opsets "
                        f"up to {supported}; this model needs opset {needed}") from None
                raise self._error(model, text) from None
        raise ModelError(f"model '{model.graph.name}': onnxruntime refuses it")

    @staticmethod
    def _error(model: onnx.ModelProto, text: str) -> Exception:
        """onnxruntime's refusal as an UnsupportedOperator where it names an operator."""
        opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                    default=1)
        if m := _MISSING.search(text):
            node = next((n for n in model.graph.node if n.op_type == m.group(1)
                         and n.name == m.group(3)), None)
            return UnsupportedOperator(m.group(1), node.domain if node else "", int(m.group(2)),
                                       m.group(3), "onnxruntime")
        if m := _UNREGISTERED.search(text):
            node = next((n for n in model.graph.node if n.op_type == m.group(2)), None)
            domain_opset = next((o.version for o in model.opset_import
                                 if o.domain == m.group(1)), opset)
            return UnsupportedOperator(m.group(2), m.group(1), domain_opset,
                                       node.name if node else "", "onnxruntime")
        first = " ".join(text.split())[:300]
        return ModelError(f"model '{model.graph.name}': onnxruntime cannot load it: {first}")

    def run(self, inputs: Any, **kwargs: Any) -> list[Any]:
        feeds = {k: _as_input(v) for k, v in self.bind(inputs).items()}
        return [_as_output(x) for x in self._session.run(None, feeds)]

    @property
    def native(self) -> Any:
        return self._session

    def settings(self) -> dict[str, Any]:
        options = self._session.get_session_options()
        return {"graph_optimization_level": str(options.graph_optimization_level).split(".")[-1],
                "intra_op_num_threads": options.intra_op_num_threads,
                "providers": self._session.get_providers()}


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    trainable = False
    about = FRAMEWORK.about
    modes = FRAMEWORK.modes

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            import onnxruntime as ort
            return "CUDAExecutionProvider" in ort.get_available_providers()
        return super().supports_device(device)

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return OnnxRuntimeExecutable(model, device, cls.mode)
