"""The reference (NumPy) Trainer, for checking the others: NumPy gradients from the reference
backend and the framework-neutral optimizer on the numpy ops (speed is not its job). Steps run the
model's training form; its updated running statistics are written back beside the parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from d500.backends.trainer_base import Trainer
from d500.errors import UsageError


class ReferenceTrainer(Trainer):
    """Per step: the loss and its gradients from the reference backend on the part of the graph
    the loss needs, then the optimizer's update of NumPy parameters, written back."""

    def __init__(self, executable: Any, optimizer: Any, loss: str = "loss", native: bool = False):
        super().__init__(executable, optimizer, loss, native)
        if self.native:
            raise UsageError("backend 'reference' has no framework-native optimizers: use the "
                             "framework-neutral ones (native: false)")
        self.parts: dict[tuple[str, bool], tuple[Any, list[str], list[str]]] = {}
        self.state = optimizer.init(self.parameters(), "numpy")

    def _part(self, output: str, train: bool = False) -> tuple[Any, list[str], list[str]]:
        """The reference executable of the subgraph computing `output` (of the training form
        if `train`), its inputs, and the running statistics its further outputs update."""
        found = self.parts.get((output, train))
        if found is None:
            source = self.training.model if train else self.executable.model
            nodes = [(n.input, n.output, n) for n in source.graph.node]
            keep, inputs = self.needed_inputs(nodes, [output])
            made = {o for i in keep for o in source.graph.node[i].output}
            updates = [s for s, out in self.training.updates.items() if train and out in made]
            outputs = [output, *(self.training.updates[s] for s in updates)]
            model = onnx.ModelProto()
            model.CopyFrom(source)
            graph = model.graph
            nodes = [graph.node[i] for i in keep]
            graph_inputs = [i for i in graph.input if i.name in inputs or i.name not in
                            self.executable.input_names]
            graph_outputs = sorted((o for o in graph.output if o.name in outputs),
                                   key=lambda o: outputs.index(o.name))
            for field, values in (("node", nodes), ("input", graph_inputs),
                                  ("output", graph_outputs)):
                kept = [type(v)() for v in values]
                for new, old in zip(kept, values):
                    new.CopyFrom(old)
                graph.ClearField(field)
                getattr(graph, field).extend(kept)
            found = self.parts[(output, train)] = (
                type(self.executable)(model, self.executable.device), inputs, updates)
        return found

    def _train_forward(self, feeds: Mapping[str, np.ndarray]
                       ) -> tuple[float, dict[str, np.ndarray]]:
        """Loss and gradients of the training form; its running statistics written back."""
        part, inputs, updates = self._part(self.loss, train=True)
        part.set_parameters(self.executable.parameters())
        outputs, grads = part.gradients(self.batch(feeds, inputs), output=self.loss,
                                        wrt=self.parameter_names)
        if updates:
            self.executable.set_parameters(dict(zip(updates, outputs[1:])))
        return float(np.asarray(outputs[0])), grads

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        loss, grads = self._train_forward(feeds)
        params = self.parameters()
        self.optimizer.step(params, grads, self.state, lr)
        self.executable.set_parameters(params)
        return loss

    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the reference backend's gradients (new writable arrays), no parameter
        update (running statistics are updated: a training forward)."""
        loss, grads = self._train_forward(feeds)
        return loss, {n: np.array(g) for n, g in grads.items()}

    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The optimizer's NumPy update from `grads`, written back into the executable."""
        self.check_gradients(grads)
        params = self.parameters()
        self.optimizer.step(params, {n: np.asarray(grads[n]) for n in params}, self.state, lr)
        self.executable.set_parameters(params)

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        part, inputs, _ = self._part(output)
        part.set_parameters(self.executable.parameters())
        return part.run(self.batch(feeds, inputs))[0]
