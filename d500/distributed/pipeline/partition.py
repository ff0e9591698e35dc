"""The ONNX graph cut into P pipeline stages, balanced by a cost model (a forward and a backward's
FLOPs per node, from the shapes), only where few float tensors cross; each stage as an ONNX
sub-model of its own.

    part = partition(model, 2)          # Partition: stages of consecutive nodes
    print(part.show())                  # stage, nodes, cost, the tensors crossing each cut
    sub = part.model(1)                 # stage 1's sub-model (its inputs: the tensors it receives)

The nodes stay in the graph's (topological) order and a stage is a run of consecutive nodes, so
a cut is a position between two nodes. The tensors crossing a cut are those made before it and
read after it (graph inputs are not: every rank of a pipeline holds the batch, so `labels` is
read where the loss is). A cut is allowed where 1..MAX_CROSSING float tensors cross (a gradient
must come back through each), each with the batch as its first dimension; among the allowed
cuts, the P-1 that make the costliest stage cheapest are chosen (dynamic programming), ties
going to fewer bytes crossing, every stage holding a parameter. A node's cost is its FLOPs per
sample for a forward and a backward (`train_cost`): the forward's FLOPs (d500.operators.flops,
shapes inferred at a batch of one; an operator without a formula costs one FLOP per output
element), plus, for its backward, those FLOPs again for each operand of a linear operator (Gemm,
MatMul, Conv) that needs a gradient, or once for any other operator with such an input. A tensor
needs a gradient where it is made from a parameter: a first layer reading the batch computes its
weights' gradient only, a later one also its input's, so the layers after the first cost 3
forwards, the first 2 (cutting by forward FLOPs alone misses that). A tensor that crosses two
cuts passes through the stages between by an Identity node (`PASS` names its copy). A Constant
node's output (an attention scale, a causal mask) never crosses: each stage that reads it holds
the node. A parameter read in several stages (a tied embedding: the first stage's lookup, the
last's output projection) is held by each of them (`Partition.shared`), as Megatron-LM holds it;
the pipeline sums its gradient over those stages every step, so the copies stay the same.

With tensor parallelism inside the stages (`cut(model, spec)`), the tensor split is found first
and no cut falls inside one of its blocks or right after its row linear (whose partial output is
summed by the node after it): each stage holds whole blocks, at least one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from d500.errors import UsageError

MAX_CROSSING = 2  # tensors a cut may carry (each one message forward, one gradient back)
PASS = "::pass"  # suffix of a tensor's copy through a stage it only crosses


@dataclass
class Stage:
    """One stage: its nodes (indices into the graph's nodes), FLOPs per sample, the tensors it
    receives and sends (by their names in the whole graph), the graph inputs it reads and the
    parameters (float initializers) it holds."""

    index: int
    nodes: list[int]
    cost: float  # FLOPs per sample of its forward and backward (what the cut balances)
    receives: list[str]
    sends: list[str]
    feeds: list[str]
    params: list[str]
    forward: float = 0.0  # ... of its forward alone


@dataclass
class Partition:
    """The stages of `model` and the bytes per sample of each crossing tensor."""

    model_proto: onnx.ModelProto
    stages: list[Stage]
    nbytes: dict[str, int]  # bytes per sample of every tensor that crosses a cut
    sample: dict[str, tuple[tuple[int, ...], np.dtype]]  # ... its shape less the batch, dtype
    shared: dict[str, list[int]] = field(default_factory=dict)  # a tied weight -> its stages

    def buffer(self, tensor: str, batch: int) -> np.ndarray:
        """An empty array for crossing tensor `tensor` at `batch` samples (to receive into)."""
        shape, dtype = self.sample[tensor]
        return np.empty((batch, *shape), dtype=dtype)

    def record(self) -> dict[str, Any]:
        """The cut as plain data (a run's details)."""
        nodes = self.model_proto.graph.node
        return {"stages": [{"stage": s.index, "nodes": [_label(nodes[i], i) for i in s.nodes],
                            "flops_per_sample": s.forward,
                            "train_flops_per_sample": s.cost, "sends": s.sends,
                            "send_bytes_per_sample": sum(self.nbytes[t] for t in s.sends),
                            "params": len(s.params)} for s in self.stages],
                "imbalance": self.imbalance}

    @property
    def imbalance(self) -> float:
        """The costliest stage over the mean stage, forward and backward FLOPs (1.0: perfectly
        balanced)."""
        costs = [s.cost for s in self.stages]
        return max(costs) / (sum(costs) / len(costs)) if sum(costs) else 1.0

    def show(self) -> str:
        """The cut as a table, one line per stage."""
        nodes = self.model_proto.graph.node
        total = sum(s.cost for s in self.stages) or 1.0
        spans = []
        for s in self.stages:
            span = f"{len(s.nodes)}: {_label(nodes[s.nodes[0]], s.nodes[0])}"
            if len(s.nodes) > 1:
                span += f" .. {_label(nodes[s.nodes[-1]], s.nodes[-1])}"
            spans.append(span)
        w = max(len(x) for x in [*spans, "nodes"])
        lines = [f"{'stage':>5}  {'nodes':<{w}}  {'kFLOP/sample (fwd+bwd)':>22} {'share':>6}"
                 f"  sends"]
        for s, span in zip(self.stages, spans):
            sends = ", ".join(f"{t} ({self.nbytes[t]} B/sample)" for t in s.sends) or "-"
            lines.append(f"{s.index:>5}  {span:<{w}}  {s.cost / 1e3:>22.1f} "
                         f"{100 * s.cost / total:>5.1f}%  {sends}")
        lines.append(f"imbalance (costliest stage / mean): {self.imbalance:.3f}")
        return "\n".join(lines)

    def model(self, index: int) -> onnx.ModelProto:
        """Stage `index`'s sub-model: inputs the tensors it receives then the graph inputs it
        reads; outputs the tensors it sends (a passed-through one as its PASS copy), or, for the
        last stage, the graph's outputs it computes; its parameters as initializers."""
        m, s = self.model_proto, self.stages[index]
        g = m.graph
        types = value_infos(m)
        nodes = [g.node[i] for i in s.nodes]
        made = {o for n in nodes for o in n.output}
        outputs = []
        for t in s.sends:
            if t in made:
                outputs.append(types[t])
            else:  # crosses this stage only: an Identity to a copy of its own name
                nodes.append(helper.make_node("Identity", [t], [t + PASS]))
                info = onnx.ValueInfoProto()
                info.CopyFrom(types[t])
                info.name = t + PASS
                outputs.append(info)
        if index == len(self.stages) - 1:
            outputs = [o for o in g.output if o.name in made]
        inputs = [types[t] for t in s.receives] + [i for i in g.input if i.name in s.feeds]
        read = {i for n in nodes for i in n.input} - made
        nodes = [n for n in g.node if n.op_type == "Constant" and n.output[0] in read] + nodes
        used = {i for n in nodes for i in n.input}
        inits = [t for t in g.initializer if t.name in used]
        graph = helper.make_graph(nodes, f"{g.name}.stage{index}", inputs, outputs, inits)
        sub = helper.make_model(graph, opset_imports=list(m.opset_import),
                                ir_version=m.ir_version)
        return sub


def partition(model: onnx.ModelProto, stages: int, where: str = "the model",
              keep: list[tuple[int, int]] = ()) -> Partition:
    """`model` cut into `stages` stages (see the module docstring); a UsageError naming the
    count and the model where that many stages do not fit. `keep`: spans (first, last) of
    nodes that stay in one stage, each stage holding one (a tensor split's blocks)."""
    g = model.graph
    n = len(g.node)
    if stages < 1 or stages > n:
        raise UsageError(f"{where}: {stages} pipeline stages for a graph of {n} nodes (a stage "
                         f"holds at least one node: at most {n})")
    shapes, dtypes = shapes_at_one(model)
    forward = [_cost(node, shapes) for node in g.node]
    costs = train_cost(model, forward)
    crossing = _crossings(model)
    nbytes = {t: int(math.prod(shapes[t]) * dtypes[t].itemsize)
              for ts in crossing.values() for t in ts}
    allowed = [k for k in range(1, n) if 1 <= len(crossing[k]) <= MAX_CROSSING
               and all(dtypes[t].kind == "f" and shapes[t][:1] == (1,) for t in crossing[k])
               and not any(a < k <= b for a, b in keep)]
    if len(allowed) < stages - 1:
        raise UsageError(f"{where}: {stages} pipeline stages need {stages - 1} cuts, and the "
                         f"graph has {len(allowed)} place(s) where 1 to {MAX_CROSSING} float "
                         f"tensors cross{' outside the tensor blocks' if keep else ''} (use "
                         f"pipeline: {len(allowed) + 1} or fewer)")
    params = _parameters(model)
    holds = [any(i in set(params) for i in node.input) for node in g.node]
    if keep:  # every stage holds a block (its tensor group has a chain to split)
        holds = [any(b == k for _, b in keep) for k in range(n)]
    cuts = _balanced(costs, holds, allowed, stages,
                     lambda k: sum(nbytes[t] for t in crossing[k]))
    if cuts is None:
        what = "a whole tensor block" if keep else "a parameter"
        raise UsageError(f"{where}: no cut into {stages} pipeline stages leaves {what} in "
                         f"every stage (a stage without one has nothing to "
                         f"{'split' if keep else 'train'}); use fewer stages")
    bounds = [0, *cuts, n]
    inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
    out = []
    for s in range(stages):
        idx = list(range(bounds[s], bounds[s + 1]))
        read = {i for k in idx for i in g.node[k].input}
        out.append(Stage(s, idx, float(sum(costs[k] for k in idx)),
                         list(crossing[bounds[s]]) if s else [],
                         list(crossing[bounds[s + 1]]) if s < stages - 1 else [],
                         [i.name for i in g.input if i.name in inputs and i.name in read],
                         [p for p in params if p in read],
                         float(sum(forward[k] for k in idx))))
    holders = {p: [st.index for st in out if p in st.params] for p in params}
    return Partition(model, out, nbytes, {t: (shapes[t][1:], dtypes[t]) for t in nbytes},
                     {p: s for p, s in holders.items() if len(s) > 1})


def cut(model: onnx.ModelProto, spec: Any, where: str = "the model") -> Partition:
    """`model` cut into spec.pipeline stages; with spec.tensor > 1 only between the blocks of
    its tensor split (each stage whole blocks; see the module docstring)."""
    keep: list[tuple[int, int]] = []
    if spec.tensor > 1:
        from d500.distributed.tensor.split import find
        split = find(model, spec.tensor, where=f"{spec.where}: field 'distributed.tensor'")
        keep = [(b.nodes[0], b.row + 1) for b in split.blocks]
    return partition(model, spec.pipeline, where, keep)


def stage_bytes(model: onnx.ModelProto, spec: Any, world: int) -> dict[int, int]:
    """Each rank's parameter bytes (rank -> bytes) when `model` is cut into spec.pipeline
    stages at `world` ranks, each stage split spec.tensor ways where > 1 (the judge's check of
    the ranks' memory claims)."""
    from d500.distributed.grid import coordinates
    part = cut(model, spec)
    size = {t.name: math.prod(t.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(
        t.data_type)).itemsize for t in model.graph.initializer}
    held = [sum(size[p] for p in s.params) for s in part.stages]
    if spec.tensor > 1:  # a tensor rank holds 1/T of its stage's split weights
        from d500.distributed.tensor.split import find
        held = [find(part.model(s.index), spec.tensor).rank_bytes() for s in part.stages]
    dims = spec.dims(world)
    return {r: int(held[coordinates(r, dims)["pipeline"]]) for r in range(world)}


def least_sent(model: onnx.ModelProto, spec: Any, world: int, batch: int) -> dict[int, int]:
    """The bytes each rank must send a step at the least (rank -> bytes): its stage's crossing
    tensors forward, and the gradients of those it received back, for its data share of the
    global `batch` (the smaller share where the data ranks do not divide it); with spec.tensor
    > 1, each tensor rank to its peer, plus its part of its stage's blocks' allreduces."""
    from d500.distributed.grid import coordinates
    part = cut(model, spec)
    dims = spec.dims(world)
    n = batch // dims["data"]
    inner: dict[tuple[int, int], int] = {}
    if spec.tensor > 1:  # the tensor split's floor of each stage's own sub-model
        from dataclasses import replace

        from d500.distributed.tensor.split import least_sent as split_least
        one = replace(spec, pipeline=1, data=dims["data"])
        world_t = dims["data"] * spec.tensor
        for s in part.stages:
            floor = split_least(part.model(s.index), one, world_t, batch)
            inner.update({(s.index, r): b for r, b in floor.items()})
    out = {}
    for r in range(world):
        c = coordinates(r, dims)
        s = part.stages[c["pipeline"]]
        own = c["data"] * spec.tensor + c["tensor"]  # its rank in a stage's data x tensor grid
        out[r] = sum(part.buffer(t, n).nbytes for t in [*s.sends, *s.receives]) + \
            inner.get((s.index, own), 0)
    return out


def _balanced(costs: list[float], holds: list[bool], allowed: list[int], stages: int,
              cross: Any) -> list[int] | None:
    """The `stages`-1 cuts from `allowed` (sorted positions) minimising the costliest stage,
    then the bytes crossing, every stage holding a node that `holds` a parameter (None: no such
    cuts)."""
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    owned = np.concatenate([[0], np.cumsum(holds)])
    ends = [*allowed, len(costs)]  # where a stage may end
    # best[j][i]: (costliest stage, bytes crossing) of stages 0..j, stage j ending at ends[i]
    inf = (math.inf, math.inf)
    best = [[inf] * len(ends) for _ in range(stages)]
    back = [[-1] * len(ends) for _ in range(stages)]
    for i, e in enumerate(ends):
        if owned[e] > 0:
            best[0][i] = (prefix[e], 0.0)
    for j in range(1, stages):
        for i, e in enumerate(ends):
            for h in range(i):  # the previous stage ends at ends[h] = a cut
                start = ends[h]
                prev = best[j - 1][h]
                if owned[e] == owned[start] or prev == inf:
                    continue
                cand = (max(prev[0], prefix[e] - prefix[start]), prev[1] + cross(start))
                if cand < best[j][i]:
                    best[j][i], back[j][i] = cand, h
    i, cuts = len(ends) - 1, []
    if best[stages - 1][i] == inf:
        return None
    for j in range(stages - 1, 0, -1):
        i = back[j][i]
        cuts.append(ends[i])
    return sorted(cuts)


def _crossings(model: onnx.ModelProto) -> dict[int, list[str]]:
    """For each position k (a cut before node k, 0..n), the tensors made by nodes before it
    and read by nodes from it on (in the order they were made)."""
    g = model.graph
    made_at: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for k, node in enumerate(g.node):
        for i in node.input:
            if i:
                last_read[i] = k
        for o in node.output:
            if o:
                made_at[o] = k
    constant = {n.output[0] for n in g.node if n.op_type == "Constant"}  # copied, not sent
    return {k: [t for t, at in made_at.items()
                if at < k and last_read.get(t, -1) >= k and t not in constant]
            for k in range(len(g.node) + 1)}


def _parameters(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer
            if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]


def shapes_at_one(model: onnx.ModelProto) -> tuple[dict[str, tuple[int, ...]], dict[str, np.dtype]]:
    """Every tensor's shape at a batch of one (symbolic dimensions set to 1) and dtype."""
    one = onnx.ModelProto()
    one.CopyFrom(model)
    for i in one.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.dim_value = 1
    del one.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(one, data_prop=True)
    shapes, dtypes = {}, {}
    g = inferred.graph
    for v in [*g.input, *g.value_info, *g.output]:
        t = v.type.tensor_type
        if t.elem_type:
            dtypes[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
            shapes[v.name] = tuple(max(d.dim_value, 1) for d in t.shape.dim)
    for t in g.initializer:
        shapes[t.name] = tuple(t.dims)
        dtypes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    return shapes, dtypes


LINEAR = ("Gemm", "MatMul", "Conv", "ConvTranspose")  # backward: one forward per operand


def train_cost(model: onnx.ModelProto, forward: list[float]) -> list[float]:
    """Each node's FLOPs per sample for a forward and a backward, from its forward's
    (`forward`, one per node): see the module docstring."""
    needs = set(_parameters(model))  # tensors made from a parameter: their gradient is needed
    out = []
    for node, f in zip(model.graph.node, forward):
        grads = [i in needs for i in node.input]
        if any(grads):
            needs.update(o for o in node.output if o)
        backward = sum(grads[:2]) if node.op_type in LINEAR else float(any(grads))
        out.append(f * (1 + backward))
    return out


def _cost(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> float:
    """FLOPs per sample of `node`: its formula, else one per output element."""
    from d500.operators import flops
    ins = [shapes.get(i, ()) for i in node.input]
    outs = [shapes.get(o, ()) for o in node.output]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        found = flops.count(node.op_type, attrs, ins, outs)
    except (IndexError, TypeError, ValueError):
        found = None
    return float(found) if found is not None else float(sum(math.prod(o) for o in outs))


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every tensor's ValueInfo with its symbolic batch kept (for a sub-model's inputs)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    return {v.name: v for v in [*g.input, *g.value_info, *g.output]}


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type}#{index}" + (f" {node.name}" if node.name else "")
