"""One tensor rank's model: its rewritten ONNX graph (split.Split.rank_model) cut into segments at
the blocks' edges, each translated by the backend, run forward and backward with the Megatron
allreduces between them (the f and g conjugate operators).

    model = RankModel(split, t, backend_cls, optimizer, native, comm)
    loss, grads = model.gradients(feeds, scale)   # the whole batch's loss; this rank's gradients
    model.trainer.apply(grads, lr)                # the entry's optimizer, every segment's weights
    values = model.forward(feeds)                 # a pipeline stage's: every tensor it makes
    values, grads, given = model.backward(feeds, {"sent": g})   # from its outputs' gradients

A segment is a run of consecutive nodes, all inside one block (parallel) or none (replicated).
Forward, each segment runs on what earlier ones made; a parallel segment's outputs are partial
sums, allreduced over the tensor ranks (g). Backward walks the segments in reverse with
`Executable.gradients(grad_outputs=...)`, the gradient of each segment's outputs as the later
segments gave it; a parallel segment's gradients of its inputs are partial (each rank's shard
contributes its part), allreduced before they flow on (f). The replicated segments compute the
same on every rank, so their weights' gradients need no communication. A weight read in two
segments (a tied embedding) is held by the first; the later ones read it as an input, and the
gradient they give back for it is added to the holder's. As a pipeline stage, the model's
inputs named `receives` (the activations its stage receives) are differentiated too, and
backward starts from given gradients of any outputs (the tensors it sends). Backward recomputes each
segment's forward from its stashed inputs (one extra forward per step; the framework's graph of
a segment is not kept between the passes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from d500.distributed.pipeline.partition import value_infos
from d500.distributed.tensor.split import Split
from d500.errors import UsageError


@dataclass
class Segment:
    """Consecutive nodes of the rank's model: whether they are in a block, the tensors they read
    (made earlier, or graph inputs) and make (read later, or graph outputs), its sub-model."""

    parallel: bool
    nodes: list[onnx.NodeProto]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    exe: Any = None
    trainer: Any = None
    wrt: list[str] = field(default_factory=list)  # its parameters, then inputs to differentiate
    params: list[str] = field(default_factory=list)


class RankModel:
    """Tensor rank `rank` of `split` (see the module docstring); `allreduce(array)` sums an
    array over the tensor ranks in place (the tensor dimension's Communicator.allreduce)."""

    def __init__(self, split: Split, rank: int, backend_cls: Any, optimizer: Any,
                 native: bool, allreduce: Any, loss: str | None = "loss",
                 receives: list[str] = ()):
        self.split, self.rank, self.allreduce, self.loss_name = split, rank, allreduce, loss
        self.receives = list(receives)
        model, flags = split.rank_model(rank)
        self.model = model
        self.segments = segments(model, flags)
        floats = {t.name for t in model.graph.initializer
                  if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"}
        diff = differentiable(model, floats | set(self.receives))
        types = value_infos(model)
        for seg in self.segments:
            seg.exe = backend_cls.prepare(submodel(model, seg, types))
            seg.params = [n for n in seg.exe.parameter_names if n in floats]
            seg.wrt = [*seg.params, *(i for i in seg.inputs if i in diff)]
            if seg.params:
                target = loss if loss in seg.outputs else seg.outputs[0]
                seg.trainer = seg.exe.trainer(copy.deepcopy(optimizer), loss=target,
                                              native=native)
                if seg.trainer.buffer_names:
                    raise UsageError(f"tensor rank {rank}: the model holds running statistics "
                                     f"({seg.trainer.buffer_names[0]}, BatchNormalization): "
                                     f"tensor parallelism of such a model is not built yet "
                                     f"(use tensor: 1)")
        if self.segments[-1].parallel or (loss is not None
                                          and loss not in self.segments[-1].outputs):
            made = f"the loss '{loss}' is not made by" if loss else "a block ends"
            raise UsageError(f"tensor rank {rank}: {made} the model's last nodes (they must "
                             f"follow every block)")
        self.trainer = Shards([s.trainer for s in self.segments if s.trainer is not None])

    def gradients(self, feeds: dict[str, np.ndarray], scale: float = 1.0
                  ) -> tuple[float, dict[str, np.ndarray]]:
        """(the loss of `feeds`, `scale` x its gradients of this rank's parameters)."""
        seed = {self.loss_name: np.asarray(scale, dtype=np.float32)}
        values, grads, _ = self.backward(feeds, seed)
        return float(values[self.loss_name]), grads

    def forward(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor the segments make (their outputs), with the blocks' partial sums
        summed: a pipeline stage's forward, no gradient kept."""
        values: dict[str, np.ndarray] = {**feeds, **self._shared()}
        for seg in self.segments:
            self._run(seg, values)
        return values

    def backward(self, feeds: dict[str, np.ndarray], seeds: dict[str, np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(every value the segments make, this rank's parameter gradients, the gradients of
        the inputs named `receives`) from the gradients `seeds` of some outputs (the loss's
        scale, or what the next pipeline stage gave back)."""
        values: dict[str, np.ndarray] = {**feeds, **self._shared()}
        stash = [self._run(seg, values) for seg in self.segments[:-1]]
        last = self.segments[-1]
        ins = {n: values[n] for n in last.inputs}
        flowing = dict(seeds)
        given = {o: flowing.pop(o) for o in last.outputs if o in flowing}
        grads: dict[str, np.ndarray] = {}
        outs, g = last.exe.gradients(ins, grad_outputs=given, wrt=last.wrt)
        values.update({o: outs[last.exe.output_index(o)] for o in last.outputs})
        self._take(last, g, grads, flowing)
        for seg, ins in zip(reversed(self.segments[:-1]), reversed(stash)):
            given = {o: flowing.pop(o) for o in seg.outputs if o in flowing}
            if not given:
                continue  # nothing it made reaches the loss (constants, masks)
            _, g = seg.exe.gradients(ins, grad_outputs=given, wrt=seg.wrt)
            self._take(seg, g, grads, flowing)
        return values, grads, {n: flowing.pop(n) for n in self.receives}

    def _run(self, seg: Segment, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`seg`'s forward on `values` (its outputs added to them, a block's partial sums
        summed: g); the inputs it read."""
        ins = {n: values[n] for n in seg.inputs}
        outs = seg.exe.run(ins)
        for name in seg.outputs:
            a = outs[seg.exe.output_index(name)]
            if seg.parallel:  # g: the partial sums of the ranks' shards, summed
                a = self.allreduce(np.array(a, copy=True))
            values[name] = a
        return ins

    def _shared(self) -> dict[str, np.ndarray]:
        """The current value of each weight a later segment reads as an input (a tied
        embedding: its holder's, the first segment that reads it)."""
        names = {i for seg in self.segments for i in seg.inputs} & set(self.trainer.owner)
        if not names:
            return {}
        views = self.trainer.parameter_views()
        values = views if views is not None else self.trainer.parameters()
        return {n: values[n] for n in names}

    def _take(self, seg: Segment, g: dict[str, np.ndarray], grads: dict[str, np.ndarray],
              flowing: dict[str, np.ndarray]) -> None:
        """`seg`'s parameter gradients into `grads`, its inputs' into `flowing` (summed over
        the tensor ranks first where the segment is parallel: f)."""
        for n in seg.params:  # plus what later segments that read it as an input gave back
            grads[n] = g[n] + flowing.pop(n) if n in flowing else g[n]
        for n in seg.wrt[len(seg.params):]:
            a = np.array(g[n], copy=True)
            if seg.parallel:
                a = self.allreduce(a)
            if n in flowing:
                flowing[n] = flowing[n] + a
            else:
                flowing[n] = a


class Shards:
    """The trainers of a rank's segments as one (the part of a level-2 Trainer a scheme uses):
    parameters by name, the entry's optimizer applied to each segment's own."""

    buffer_names: list[str] = []

    def __init__(self, trainers: list[Any]):
        self.trainers = trainers
        self.owner = {n: t for t in trainers for n in t.parameter_names}
        self.parameter_names = list(self.owner)

    def parameters(self) -> dict[str, np.ndarray]:
        return {n: a for t in self.trainers for n, a in t.parameters().items()}

    def parameter_views(self) -> dict[str, np.ndarray] | None:
        views = [t.parameter_views() for t in self.trainers]
        if any(v is None for v in views):
            return None
        return {n: a for v in views for n, a in v.items()}

    def set_parameters(self, values: dict[str, np.ndarray]) -> None:
        for t in self.trainers:
            mine = {n: v for n, v in values.items() if self.owner.get(n) is t}
            if mine:
                t.set_parameters(mine)

    def buffers(self) -> dict[str, np.ndarray]:
        return {}

    def set_buffers(self, values: dict[str, np.ndarray]) -> None:
        if values:
            raise UsageError("a tensor-parallel model holds no running statistics")

    def apply(self, grads: dict[str, np.ndarray], lr: float) -> None:
        for t in self.trainers:
            t.apply({n: grads[n] for n in t.parameter_names}, lr)

    def state_bytes(self) -> int:
        from d500.distributed.schemes.base import state_bytes
        return sum(state_bytes(getattr(t, "state", None)) for t in self.trainers)


def segments(model: onnx.ModelProto, blocks: list[int]) -> list[Segment]:
    """The rank model's nodes in runs of the same block (-1: none), each with what it reads and
    makes."""
    g = model.graph
    segs: list[Segment] = []
    last = None
    for node, block in zip(g.node, blocks):
        if block != last:
            segs.append(Segment(block >= 0, []))
            last = block
        segs[-1].nodes.append(node)
    graph_inputs = [i.name for i in g.input]
    graph_outputs = {o.name for o in g.output}
    made_by: dict[str, int] = {}
    for s, seg in enumerate(segs):
        for n in seg.nodes:
            for o in n.output:
                made_by[o] = s
    inits = {t.name for t in g.initializer}
    first: dict[str, int] = {}  # a weight -> the first segment reading it (which holds it)
    for s, seg in enumerate(segs):
        for n in seg.nodes:
            for i in n.input:
                if i in inits:
                    first.setdefault(i, s)
    for s, seg in enumerate(segs):
        read = [i for n in seg.nodes for i in n.input if i and (i not in inits or first[i] < s)]
        seg.inputs = list(dict.fromkeys(i for i in read if made_by.get(i, s) < s
                                        or i in graph_inputs or first.get(i, s) < s))
        later = {i for other in segs[s + 1:] for n in other.nodes for i in n.input}
        seg.outputs = [o for n in seg.nodes for o in n.output
                       if o and (o in later or o in graph_outputs)]
    return segs


def differentiable(model: onnx.ModelProto, params: set[str]) -> set[str]:
    """The tensors that depend on a float parameter (the ones a gradient flows through)."""
    out = set(params)
    for n in model.graph.node:
        if any(i in out for i in n.input):
            out.update(o for o in n.output if o)
    return out


def submodel(model: onnx.ModelProto, seg: Segment, types: dict[str, onnx.ValueInfoProto]
              ) -> onnx.ModelProto:
    """`seg` as an ONNX model of its own, its inputs and outputs typed by `types`."""
    g = model.graph
    used = {i for n in seg.nodes for i in n.input} - set(seg.inputs)
    inits = [t for t in g.initializer if t.name in used]
    shared = {t.name: helper.make_tensor_value_info(t.name, t.data_type, t.dims)
              for t in g.initializer}  # a weight held by an earlier segment comes in as an input
    graph = helper.make_graph(seg.nodes, f"{g.name}.segment",
                              [types.get(i) or shared[i] for i in seg.inputs],
                              [types[o] for o in seg.outputs], inits)
    return helper.make_model(graph, opset_imports=list(model.opset_import),
                             ir_version=model.ir_version)
