"""The reference (NumPy) Trainer, for checking the others: NumPy gradients from the reference
backend and the framework-neutral optimizer on the numpy ops (speed is not its job)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from d500.backends.base import Trainer
from d500.errors import UsageError


class ReferenceTrainer(Trainer):
    """Per step: the loss and its gradients from the reference backend on the part of the graph
    the loss needs, then the optimizer's update of NumPy parameters, written back."""

    def __init__(self, executable: Any, optimizer: Any, loss: str = "loss", native: bool = False):
        super().__init__(executable, optimizer, loss, native)
        if self.native:
            raise UsageError("backend 'reference' has no framework-native optimizers: use the "
                             "framework-neutral ones (native: false)")
        self.nodes = [(n.input, n.output, n) for n in executable.model.graph.node]
        self.parts: dict[str, tuple[Any, list[str]]] = {}
        self.state = optimizer.init(executable.parameters(), "numpy")

    def _part(self, output: str) -> tuple[Any, list[str]]:
        """The reference executable of the subgraph computing `output`, and its inputs."""
        found = self.parts.get(output)
        if found is None:
            keep, inputs = self.needed_inputs(self.nodes, [output])
            model = onnx.ModelProto()
            model.CopyFrom(self.executable.model)
            graph = model.graph
            nodes = [graph.node[i] for i in keep]
            graph_inputs = [i for i in graph.input if i.name in inputs or i.name not in
                            self.executable.input_names]
            graph_outputs = [o for o in graph.output if o.name == output]
            for field, values in (("node", nodes), ("input", graph_inputs),
                                  ("output", graph_outputs)):
                kept = [type(v)() for v in values]
                for new, old in zip(kept, values):
                    new.CopyFrom(old)
                graph.ClearField(field)
                getattr(graph, field).extend(kept)
            found = self.parts[output] = (type(self.executable)(model, self.executable.device),
                                          inputs)
        return found

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        part, inputs = self._part(self.loss)
        params = self.executable.parameters()
        part.set_parameters(params)
        outputs, grads = part.gradients(self.batch(feeds, inputs), output=self.loss,
                                        wrt=self.executable.parameter_names)
        self.optimizer.step(params, grads, self.state, lr)
        self.executable.set_parameters(params)
        return float(np.asarray(outputs[0]))

    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the reference backend's gradients (new writable arrays), no update."""
        part, inputs = self._part(self.loss)
        part.set_parameters(self.executable.parameters())
        outputs, grads = part.gradients(self.batch(feeds, inputs), output=self.loss,
                                        wrt=self.executable.parameter_names)
        return float(np.asarray(outputs[0])), {n: np.array(g) for n, g in grads.items()}

    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The optimizer's NumPy update from `grads`, written back into the executable."""
        self.check_gradients(grads)
        params = self.executable.parameters()
        self.optimizer.step(params, {n: np.asarray(grads[n]) for n in params}, self.state, lr)
        self.executable.set_parameters(params)

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        part, inputs = self._part(output)
        part.set_parameters(self.executable.parameters())
        return part.run(self.batch(feeds, inputs))[0]
