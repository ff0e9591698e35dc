"""One pipeline stage split over its tensor group: the stage's sub-model split T ways (the
Megatron blocks it holds whole) and run as a tensor RankModel, with StageModel's passes.

    stage = SplitStage(part, index, backend_cls, optimizer, native, grid)
    sent, kept, held = stage.forward(inputs)      # replicated on every tensor rank of the stage
    grads, back = stage.backward(kept, grads_of_sent)   # kept: the inputs (recomputed)

Between blocks every tensor rank holds the whole activation (the blocks' partial outputs are
allreduced inside the stage), so tensor rank t of stage s sends its copy to tensor rank t of
stage s+1 over the pipeline communicator (the ranks that share data and tensor coordinates), and
the gradient comes back the same way. Sending once and broadcasting inside the next stage's
group would move the same bytes again on the tensor dimension, and put a collective on the
pipeline's critical path; each peer sending its own copy keeps the pipeline's code unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from d500.distributed.pipeline.partition import PASS, Partition
from d500.distributed.pipeline.stage import StageModel
from d500.distributed.tensor.rank import RankModel
from d500.distributed.tensor.split import find


class SplitStage(StageModel):
    """Stage `index` of `part`, this rank's shard of it over `grid.tensor`."""

    def __init__(self, part: Partition, index: int, backend_cls: Any, optimizer: Any,
                 native: bool, grid: Any, where: str = "the model", loss: str = "loss"):
        self.part, self.index = part, index
        self.info = part.stages[index]
        self.last = index == len(part.stages) - 1
        made = {o for i in self.info.nodes for o in part.model_proto.graph.node[i].output}
        self.sent_names = [t if t in made else t + PASS for t in self.info.sends]
        self.loss_name = loss
        tp = grid.tensor
        self.split = find(part.model(index), tp.size, where=f"{where}: stage {index}")
        self.rank = RankModel(self.split, grid.coords["tensor"], backend_cls, optimizer, native,
                              lambda a: tp.allreduce(a, op="sum"),
                              loss if self.last else None, self.info.receives)
        self.trainer = self.rank.trainer
        self.params = list(self.trainer.parameter_names)

    def forward(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], Any, int]:
        values = self.rank.forward(feeds)
        return ([values[n] for n in self.sent_names], feeds,
                sum(a.nbytes for a in feeds.values()))

    def loss(self, feeds: dict[str, np.ndarray], scale: float
             ) -> tuple[float, dict[str, np.ndarray], list[np.ndarray]]:
        seed = {self.loss_name: np.asarray(scale, dtype=np.float32)}
        values, grads, back = self.rank.backward(feeds, seed)
        return float(values[self.loss_name]), grads, [back[n] for n in self.info.receives]

    def backward(self, feeds: dict[str, np.ndarray], grads_out: list[np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        _, grads, back = self.rank.backward(feeds, dict(zip(self.sent_names, grads_out)))
        return grads, [back[n] for n in self.info.receives]
