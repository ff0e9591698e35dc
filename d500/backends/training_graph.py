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

A BatchNormalization node counts when it sits in the main graph in the default domain, is in
inference form with one output, and its mean and variance are float initializers that nothing
else reads (no other node, subgraph or graph output). Any other node is left as the model wrote
it. BatchNormalization below opset 14 has no training mode: a model of opset < 14 with such a node
is converted to opset 15 by onnx's version converter first (BatchNormalization-7/9 -> 15 keeps
inputs, attributes and momentum's meaning; other nodes are rewritten as the converter does); a
model it cannot convert is a ModelError naming the model and why. Models without such a node are
never converted.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import onnx
from onnx import helper

from d500.backends.dataflow import outer_reads
from d500.errors import ModelError

MIN_OPSET = 14  # BatchNormalization's training_mode attribute (and its 3-output training form)
CONVERT_TO = 15  # the opset a model below MIN_OPSET is converted to (BatchNormalization-15)


@dataclasses.dataclass(frozen=True)
class TrainingGraph:
    """The training form of a model: `model` (the given model itself when no node qualifies; a
    copy, converted to opset CONVERT_TO if the given one is below MIN_OPSET, when one does) and
    `updates`, every running statistic (an initializer name) -> the output of `model` holding
    its value after a training forward (in initializer order)."""

    model: onnx.ModelProto
    updates: dict[str, str]


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _qualifying(model: onnx.ModelProto) -> list[int]:
    """The indices of the BatchNormalization nodes that train with batch statistics."""
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


def _statistics(model: onnx.ModelProto, nodes: list[int]) -> set[str]:
    """The running mean and variance inputs of the given BatchNormalization nodes."""
    return {n for i in nodes for n in model.graph.node[i].input[3:5]}


def running_statistics(model: onnx.ModelProto) -> list[str]:
    """The running statistics (buffers) of `model` by the rule above, in initializer order (at any
    opset: below 14 they are those of the converted model `training_graph` trains)."""
    names = _statistics(model, _qualifying(model))
    return [t.name for t in model.graph.initializer if t.name in names]


def _reason(err: Exception) -> str:
    """The converter's message as one readable line (without its C++ file, line and assertion)."""
    text = next((line.strip() for line in str(err).splitlines() if line.strip()),
                type(err).__name__)
    text = re.sub(r"^.*?Assertion `.*?` failed:\s*", "", text)
    return re.sub(r"^\S+:\d+: [^:]+: ", "", text) or type(err).__name__


def converted(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (opset < MIN_OPSET) converted to opset CONVERT_TO by onnx's version converter, so
    its BatchNormalization can train; a model it cannot convert is a ModelError naming it."""
    from onnx import version_converter
    name, opset = model.graph.name or "<unnamed>", _opset(model)
    try:
        form = version_converter.convert_version(model, CONVERT_TO)
        onnx.checker.check_model(form)
    except (RuntimeError, ValueError, TypeError, onnx.checker.ValidationError) as err:
        raise ModelError(
            f"model '{name}' (opset {opset}) cannot train its BatchNormalization: training mode "
            f"needs opset >= {MIN_OPSET} and onnx's version converter cannot convert the model "
            f"to opset {CONVERT_TO}: {_reason(err)}") from err
    return form


def training_graph(model: onnx.ModelProto) -> TrainingGraph:
    """`model`'s training form (a copy, converted to opset CONVERT_TO when `model` is below
    MIN_OPSET; `model` itself when no node qualifies)."""
    nodes = _qualifying(model)
    if not nodes:
        return TrainingGraph(model, {})
    if _opset(model) < MIN_OPSET:
        form = converted(model)
        stats, nodes = _statistics(model, nodes), _qualifying(form)
        if _statistics(form, nodes) != stats:
            raise ModelError(
                f"model '{model.graph.name or '<unnamed>'}' (opset {_opset(model)}): onnx's "
                f"version converter changed its BatchNormalization nodes (running statistics "
                f"{sorted(stats)} became {sorted(_statistics(form, nodes))}): cannot train it")
    else:
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
