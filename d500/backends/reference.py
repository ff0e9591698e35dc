"""The NumPy reference backend: forward through onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from d500.backends.base import Backend, Executable, to_numpy


class ReferenceExecutable(Executable):
    backend_name = "reference"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        super().__init__(model, device)
        self._params = {t.name: to_numpy(t) for t in model.graph.initializer
                        if t.name in set(self.parameter_names)}
        self._evaluator = ReferenceEvaluator(model)

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        feeds = self.bind(inputs)
        feeds.update({k: v for k, v in self._params.items() if k not in feeds})
        return [np.asarray(x) for x in self._evaluator.run(None, feeds)]

    def parameters(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._params.items()}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            if name not in self._params:
                raise KeyError(f"'{name}' is not a parameter of this model")
            self._params[name] = np.asarray(value, dtype=self._params[name].dtype).reshape(
                self._params[name].shape)

    @property
    def native(self) -> ReferenceEvaluator:
        return self._evaluator


class ReferenceBackend(Backend):
    name = "reference"
    framework = "onnx"

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return ReferenceExecutable(model, device)
