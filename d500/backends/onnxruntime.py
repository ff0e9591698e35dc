"""onnxruntime as an inference-only peer backend, for comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from d500.backends.base import Backend, Executable
from d500.errors import UnsupportedOperator


class OnnxRuntimeExecutable(Executable):
    backend_name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        import onnxruntime as ort
        super().__init__(model, device)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        providers = (["CUDAExecutionProvider"] if device.upper().startswith("CUDA") else []) + [
            "CPUExecutionProvider"]
        try:
            self._session = ort.InferenceSession(model.SerializeToString(), options,
                                                 providers=providers)
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own untyped errors
            text = str(err)
            if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
                node = next((n for n in model.graph.node if n.op_type in text), None)
                raise UnsupportedOperator(
                    node.op_type if node else "?", node.domain if node else "",
                    max(o.version for o in model.opset_import), node.name if node else "",
                    "onnxruntime", text.splitlines()[0][:200]) from None
            raise

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        return [np.asarray(x) for x in self._session.run(None, self.bind(inputs))]

    def parameters(self) -> dict[str, np.ndarray]:
        from onnx import numpy_helper
        wanted = set(self.parameter_names)
        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer
                if t.name in wanted}

    def set_parameters(self, values: Any) -> None:
        raise NotImplementedError("onnxruntime is an inference-only backend in d500")

    def gradients(self, inputs: Any, **kwargs: Any):
        raise NotImplementedError("onnxruntime is an inference-only backend in d500")

    @property
    def native(self) -> Any:
        return self._session


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    framework = "onnxruntime"
    trainable = False

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            import onnxruntime as ort
            return "CUDAExecutionProvider" in ort.get_available_providers()
        return super().supports_device(device)

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return OnnxRuntimeExecutable(model, device)
