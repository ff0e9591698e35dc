"""One rank's pipeline stage: its sub-model translated by the backend, a Trainer over its own
parameters (the entry's optimizer updates them), and the passes the schedule runs.

    stage = StageModel(part, index, backend_cls, optimizer, native)
    sent = stage.forward(received_or_batch)                # the tensors it sends on
    loss, grads, back = stage.loss(inputs, scale)          # the last stage
    grads, back = stage.backward(inputs, grads_of_sent)    # any other

Backward recomputes the stage's forward from its stashed inputs (GPipe's re-materialisation):
`Executable.gradients(inputs, grad_outputs=...)` is one forward and one backward, so a stage
keeps only the inputs of each micro-batch in flight, never the framework's graph of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from d500.distributed.pipeline.partition import PASS, Partition
from d500.errors import UsageError


class StageModel:
    """Stage `index` of `part` on this rank (see the module docstring)."""

    def __init__(self, part: Partition, index: int, backend_cls: Any, optimizer: Any,
                 native: bool = False, loss: str = "loss"):
        self.part, self.index = part, index
        self.info = part.stages[index]
        self.last = index == len(part.stages) - 1
        self.exe = backend_cls.prepare(part.model(index))
        made = {o for i in self.info.nodes for o in part.model_proto.graph.node[i].output}
        self.sent_names = [t if t in made else t + PASS for t in self.info.sends]
        self.loss_name = loss
        target = loss if self.last else self.sent_names[0]
        self.trainer = self.exe.trainer(optimizer, loss=target, native=native)
        if self.trainer.buffer_names:
            raise UsageError(f"pipeline stage {index} holds running statistics "
                             f"({self.trainer.buffer_names[0]}, BatchNormalization): a "
                             f"pipeline of such a model is not built yet (use pipeline: 1)")
        self.params = list(self.trainer.parameter_names)
        self.wrt = [*self.params, *self.info.receives]

    def inputs(self, received: list[np.ndarray], batch: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
        """The sub-model's feeds: the received tensors by name, then the graph inputs it reads
        from this micro-batch."""
        feeds = dict(zip(self.info.receives, received))
        feeds.update({n: batch[n] for n in self.info.feeds})
        return feeds

    def forward(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The tensors this stage sends on (no gradient kept)."""
        outs = self.exe.run(feeds)
        return [outs[self.exe.output_index(n)] for n in self.sent_names]

    def loss(self, feeds: dict[str, np.ndarray], scale: float
             ) -> tuple[float, dict[str, np.ndarray], list[np.ndarray]]:
        """The last stage: (its loss, `scale` x the loss's gradients of its parameters, and of
        the tensors it received)."""
        seed = {self.loss_name: np.asarray(scale, dtype=np.float32)}
        outs, grads = self.exe.gradients(feeds, grad_outputs=seed, wrt=self.wrt)
        loss = float(outs[self.exe.output_index(self.loss_name)])
        return loss, {n: grads[n] for n in self.params}, [grads[n] for n in self.info.receives]

    def backward(self, feeds: dict[str, np.ndarray], grads_out: list[np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Any other stage: (the gradients of its parameters, and of the tensors it received)
        given those of the tensors it sent."""
        _, grads = self.exe.gradients(feeds, grad_outputs=dict(zip(self.sent_names, grads_out)),
                                      wrt=self.wrt)
        return {n: grads[n] for n in self.params}, [grads[n] for n in self.info.receives]
