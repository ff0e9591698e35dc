"""Pre-flight of a training workload's model (levels 2 and 3): what a trainer would find wrong with
the model before step 1, found before any ledger run opens, as one line naming the workload.

    model = trainable_model(workload, seed)   # built (or loaded) and checked; ModelError if not

Which failures are the input's and which are a run's: the workload's model is part of the rules
every entry trains under, so a model that no entry on any backend could train is an input error
of the workload (exit 2, nothing recorded): a model file that does not load
(d500.model.load), a builder's shape or class count that does not fit the dataset, a model
without the training interface (inputs `input` and `labels`, outputs `logits` and `loss`; an
`input` whose declared sample shape is not the dataset's), one with no float parameter to
train, and one whose training form cannot be made (BatchNormalization below opset 14 that onnx's
version converter cannot convert: d500.backends.training_graph). A valid model that a backend
cannot translate or differentiate (an operator its table lacks: UnsupportedOperator, or a
crash in translation) is that backend's failure, as on level 1's boards: the run opens and ends
`failed`, and the board shows that entry and backend could not train the workload. (Level 3
builds every rank's trainer before its run opens, so the ranks agree on failing: there such a
failure is refused on every rank with nothing recorded.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from d500.errors import ModelError

if TYPE_CHECKING:
    import onnx

    from d500.training.workloads import Workload

INPUTS = ("input", "labels")  # what the trainers feed (d500.training.trainer, distributed.loop)
OUTPUTS = ("logits", "loss")  # what they predict with and minimise


def source(workload: Workload) -> str:
    """The workload's model as its file names it: "<file>: field 'model.file' (x.onnx)"."""
    m = workload.model
    if m.get("file") is not None:
        from pathlib import Path
        return f"{workload.path}: field 'model.file' ({Path(m['file']).name})"
    return f"{workload.path}: field 'model.builder' ({m.get('builder')})"


def trainable_model(workload: Workload, seed: int = 0) -> onnx.ModelProto:
    """The model `workload`'s runs train, built from `seed` (a builder's weights; a file's model
    is the same at every seed), checked as the module docstring says: a ModelError (or the
    builder's ConfigError) naming the workload file and its model when no trainer can train it.
    Cheap: the model is built once and its training form made once, with onnx alone."""
    from d500.backends.training_graph import running_statistics, training_graph
    from d500.training.data.dataset import shape_of

    shape, classes = shape_of(workload.dataset)
    where = source(workload)
    try:
        model = workload.build_model(seed, shape, classes)
    except ModelError as err:
        raise ModelError(f"{where}: {err}") from err
    interface(model, shape, where)
    try:
        training_graph(model)
    except ModelError as err:
        raise ModelError(f"{where}: {err}") from err
    buffers = set(running_statistics(model))
    if not any(_floating(t) and t.name not in buffers for t in model.graph.initializer):
        raise ModelError(f"{where}: model '{model.graph.name or '<unnamed>'}' has no float "
                         f"parameters (initializers) to train")
    return model


def interface(model: onnx.ModelProto, shape: tuple[int, ...], where: str) -> None:
    """A ModelError unless `model` has the inputs and outputs the trainers use and its `input`
    takes a batch of the dataset's samples (`shape`, e.g. (C, H, W)) where it declares a shape."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in inits}
    outputs = [o.name for o in graph.output]
    name = f"model '{graph.name or '<unnamed>'}'"
    for what, wanted, have in (("input", INPUTS, list(inputs)), ("output", OUTPUTS, outputs)):
        missing = [n for n in wanted if n not in have]
        if missing:
            raise ModelError(f"{where}: {name} has no {what} {', '.join(map(repr, missing))} "
                             f"(a training model has inputs {', '.join(INPUTS)} and outputs "
                             f"{', '.join(OUTPUTS)}; its {what}s: {', '.join(have) or 'none'})")
    declared = _dims(inputs["input"])
    if declared is None:
        return
    want = (None, *shape)
    if len(declared) != len(want) or any(d is not None and d != w
                                         for d, w in zip(declared[1:], want[1:])):
        shown = "(" + ", ".join("?" if d is None else str(d) for d in declared) + ")"
        raise ModelError(f"{where}: {name} takes input 'input' of shape {shown}; the "
                         f"dataset's batches are (N, {', '.join(map(str, shape))})")


def _dims(value_info: Any) -> tuple[int | None, ...] | None:
    """The declared dimensions of a tensor input (None each where not a fixed size), or None when
    it declares no shape."""
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None
                 for d in t.tensor_type.shape.dim)


def _floating(tensor: Any) -> bool:
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(tensor.data_type).kind == "f"
