"""One rank's pipeline stage: its sub-model translated by the backend, a Trainer over its own
parameters (the entry's optimizer updates them), and the passes the schedule runs.

    stage = StageModel(part, index, backend_cls, optimizer, native)
    sent, kept, held = stage.forward(inputs)               # the tensors it sends on
    loss, grads, back = stage.loss(inputs, scale)          # the last stage
    grads, back = stage.backward(kept, grads_of_sent)      # any other

A stage other than the last keeps each micro-batch's forward for its backward
(`Executable.kept`): the torch backend keeps its autograd graph (the backward runs no second
forward; `held` is the bytes the graph saved), a backend without that hook re-runs the forward
from the stashed inputs (GPipe's re-materialisation; `held` is the inputs' bytes). Measured at
batch 4096 (benchmarks/pipeline_bubble.py), the second forward was the whole of d500's extra
time over torch.distributed.pipelining's step at M = 1.
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

    def forward(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], Any, int]:
        """(The tensors this stage sends on, what its backward needs, the bytes that holds)."""
        outs, kept, held = self.exe.kept(feeds, wrt=self.wrt)
        return [outs[self.exe.output_index(n)] for n in self.sent_names], kept, held

    def loss(self, feeds: dict[str, np.ndarray], scale: float
             ) -> tuple[float, dict[str, np.ndarray], list[np.ndarray]]:
        """The last stage: (its loss, `scale` x the loss's gradients of its parameters, and of
        the tensors it received)."""
        seed = {self.loss_name: np.asarray(scale, dtype=np.float32)}
        outs, grads = self.exe.gradients(feeds, grad_outputs=seed, wrt=self.wrt)
        loss = float(outs[self.exe.output_index(self.loss_name)])
        return loss, {n: grads[n] for n in self.params}, [grads[n] for n in self.info.receives]

    def backward(self, kept: Any, grads_out: list[np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Any other stage: (the gradients of its parameters, and of the tensors it received)
        given those of the tensors it sent, from what its forward kept."""
        grads = kept(dict(zip(self.sent_names, grads_out)))
        return {n: grads[n] for n in self.params}, [grads[n] for n in self.info.receives]
