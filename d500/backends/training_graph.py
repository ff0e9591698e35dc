"""The training form of an ONNX model, shared by every backend's Trainer: BatchNormalization nodes
whose running statistics are initializers switched to training mode, their updates graph outputs.

A model as exported for inference normalises with running statistics stored as initializers
(BatchNormalization, training_mode=0). Training it the ONNX way (opset >= 14) sets
training_mode=1: the node normalises with the batch's mean and (population) variance and has two
more outputs, running_mean * momentum + batch_mean * (1 - momentum) and the same for the
variance. Those statistics are buffers: no gradient, no optimizer, overwritten by the outputs
after each training forward; predictions use the inference form with the statistics as they are.

    form = training_graph(model)      # form.model: the training form; form.updates: stat -> output
    running_statistics(model)         # the buffer names: the same nodes' mean and var initializers

A BatchNormalization node counts when it sits in the main graph at opset >= 14 of the default
domain, is in inference form with one output, and its mean and variance are float initializers
that nothing else reads (no other node, subgraph or graph output). Any other node is left as the
model wrote it (a model of opset < 14 trains its statistics as parameters, as before).
"""

from __future__ import annotations

import collections
import dataclasses

import onnx
from onnx import helper

from d500.backends.base import outer_reads

MIN_OPSET = 14  # BatchNormalization's training_mode attribute (and its 3-output training form)


@dataclasses.dataclass(frozen=True)
class TrainingGraph:
    """The training form of a model: `model` (the given model itself when no node qualifies) and
    `updates`, every running statistic (an initializer name) -> the output of `model` holding
    its value after a training forward (in initializer order)."""

    model: onnx.ModelProto
    updates: dict[str, str]


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _qualifying(model: onnx.ModelProto) -> list[int]:
    """The indices of the BatchNormalization nodes that train with batch statistics."""
    if _opset(model) < MIN_OPSET:
        return []
    graph = model.graph
    floats = {t.name for t in graph.initializer
              if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"}
    reads: collections.Counter[str] = collections.Counter()
    for node in graph.node:
        reads.update(n for n in node.input if n)
        reads.update(outer_reads(node))
    reads.update(o.name for o in graph.output)
    found = []
    for i, node in enumerate(graph.node):
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        mode = next((helper.get_attribute_value(a) for a in node.attribute
                     if a.name == "training_mode"), 0)
        stats = list(node.input[3:5])
        if (mode or len([o for o in node.output if o]) != 1 or len(stats) != 2
                or not all(s in floats and reads[s] == 1 for s in stats)
                or stats[0] == stats[1]):
            continue
        found.append(i)
    return found


def running_statistics(model: onnx.ModelProto) -> list[str]:
    """The running statistics (buffers) of `model` by the rule above, in initializer order."""
    names = {n for i in _qualifying(model) for n in model.graph.node[i].input[3:5]}
    return [t.name for t in model.graph.initializer if t.name in names]


def training_graph(model: onnx.ModelProto) -> TrainingGraph:
    """`model`'s training form (a copy; `model` itself when no node qualifies)."""
    nodes = _qualifying(model)
    if not nodes:
        return TrainingGraph(model, {})
    form = onnx.ModelProto()
    form.CopyFrom(model)
    graph = form.graph
    taken = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {
        o for n in graph.node for o in n.output} | {v.name for v in graph.value_info}
    inits = {t.name: t for t in graph.initializer}
    updates: dict[str, str] = {}
    for i in nodes:
        node = graph.node[i]
        kept = [a for a in node.attribute if a.name != "training_mode"]
        node.ClearField("attribute")
        node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
        outputs = [node.output[0]]
        for stat in node.input[3:5]:
            name, k = f"{stat}.updated", 1
            while name in taken:
                k += 1
                name = f"{stat}.updated{k}"
            taken.add(name)
            updates[stat] = name
            outputs.append(name)
            graph.output.append(helper.make_tensor_value_info(
                name, inits[stat].data_type, list(inits[stat].dims)))
        node.ClearField("output")
        node.output.extend(outputs)
    order = [t.name for t in graph.initializer if t.name in updates]
    return TrainingGraph(form, {n: updates[n] for n in order})
