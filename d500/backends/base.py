"""The backend contract: Backend (an onnx.backend.base.Backend) and Executable (a BackendRep
with training hooks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx.backend.base
import onnx.shape_inference
from onnx import helper, numpy_helper

from d500.errors import UsageError


class Executable(onnx.backend.base.BackendRep):
    """A prepared model: run it, read/set its parameters, differentiate it, reach its native object.

    `run(inputs)` takes a list in graph-input order (inputs that are not initializers) or a
    dict by name, and returns a list of NumPy arrays in graph-output order.
    """

    backend_name: ClassVar[str] = "?"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        self.model = model
        self.device = device
        init_names = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init_names]
        self.output_names = [o.name for o in model.graph.output]
        self.parameter_names = [
            t.name for t in model.graph.initializer
            if onnx.helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]

    # -- inputs ---------------------------------------------------------------
    def bind(self, inputs: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
        """Name the given inputs: a list in graph-input order or a dict by name."""
        if isinstance(inputs, Mapping):
            unknown = set(inputs) - set(self.input_names) - {
                t.name for t in self.model.graph.initializer}
            if unknown:
                raise UsageError(f"unknown model input(s) {sorted(unknown)}; "
                                 f"the model's inputs are {self.input_names}")
            return dict(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) > len(self.input_names):
            raise UsageError(f"{len(inputs)} inputs given, the model takes "
                             f"{len(self.input_names)} ({', '.join(self.input_names)})")
        return dict(zip(self.input_names, inputs))

    # -- the contract ---------------------------------------------------------
    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        raise NotImplementedError

    def parameters(self) -> dict[str, np.ndarray]:
        """The parameters (float initializers) by name, as NumPy arrays. The executable is the
        model as written (inference form): BatchNormalization's running statistics are among
        them here; a Trainer keeps them apart as buffers (see `Trainer`)."""
        raise NotImplementedError

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite some or all parameters by name."""
        raise NotImplementedError

    # -- shared by the backends' training hooks --------------------------------------------
    def gradient_targets(self, given: Mapping[str, Any], wrt: Sequence[str] | None = None
                         ) -> list[str]:
        """The names `gradients()` differentiates with respect to, for the bound inputs `given`.

        The rule, the same on every backend: the float parameters and the given float inputs
        (NumPy dtype kind "f"), parameters first; default all of them. A name in `wrt` that is
        not one of them (unknown, an input not given, an integer/bool/string tensor) is a
        UsageError naming it.
        """
        float_inputs = [n for n in self.input_names if n in given and _is_float(given[n])]
        if wrt is None:
            return [*self.parameter_names, *float_inputs]
        allowed = set(self.parameter_names) | set(float_inputs)
        targets = list(dict.fromkeys(wrt))
        for name in targets:
            if name not in allowed:
                raise UsageError(f"cannot differentiate with respect to '{name}': "
                                 f"{self._why_not_differentiable(name, given)}")
        return targets

    def _why_not_differentiable(self, name: str, given: Mapping[str, Any]) -> str:
        if name in self.input_names:
            if name not in given:
                return "that input was not given"
            return f"input of dtype {np.asarray(given[name]).dtype}, not float"
        init = next((t for t in self.model.graph.initializer if t.name == name), None)
        if init is not None:
            dtype = helper.tensor_dtype_to_string(init.data_type).removeprefix("TensorProto.")
            return f"an initializer of dtype {dtype.lower()}, not a float parameter"
        return (f"not a parameter or input of the model (inputs: "
                f"{', '.join(self.input_names) or 'none'}; {len(self.parameter_names)} "
                f"parameters)")

    def output_index(self, name: str) -> int:
        """The position of output `name`; UsageError naming the outputs if there is none."""
        if name not in self.output_names:
            raise UsageError(f"'{name}' is not an output of the model "
                             f"(outputs: {', '.join(self.output_names)})")
        return self.output_names.index(name)

    def parameter_value(self, name: str, value: Any, current: Any) -> np.ndarray:
        """A new value for parameter `name` whose present value (a tensor of the backend) is
        `current`, as NumPy in its shape; the same rule on every backend: an unknown name, or a
        value with another number of elements, is a UsageError. The caller casts it."""
        if name not in self.parameter_names or current is None:
            raise UsageError(f"'{name}' is not a parameter of this model "
                             f"(parameters: {', '.join(self.parameter_names) or 'none'})")
        array = np.asarray(value)
        shape = tuple(int(d) for d in current.shape)
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise UsageError(f"parameter '{name}' has shape {shape}, "
                             f"got a value of shape {array.shape}")
        return array.reshape(shape)

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """Run forward and backward; return (outputs, gradients by name).

        The differentiated quantity is sum(output) for a named output (the loss, when it is a
        scalar), or sum_k <output_k, grad_outputs[k]> for given output gradients; default: the
        first output. `wrt` names parameters and/or float inputs (default: all parameters and
        all given float inputs; see `gradient_targets`).
        """
        raise NotImplementedError

    @property
    def native(self) -> Any:
        """The framework's own object (torch.nn.Module, tf.Module, ...)."""
        raise NotImplementedError

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False) -> Trainer:
        """A Trainer of this model on its backend: minimise the scalar output `loss` with the
        framework-neutral d500 `optimizer` (native=True: its framework-native twin instead).
        An inference-only backend has none: a UsageError naming it."""
        raise UsageError(f"backend '{self.backend_name}' is inference-only: it cannot train "
                         f"(train on a trainable backend: torch, tensorflow or reference)")


class Trainer:
    """Training inside the framework, one update per `step`; parameters and optimizer state stay
    in framework tensors (only the batch goes in, only the loss comes out, as a Python float).

        trainer = executable.trainer(make("momentum", lr=0.1), loss="loss")
        loss = trainer.step({"input": x, "labels": y}, lr=0.1)     # forward, backward, update
        logits = trainer.predict({"input": x})                     # no update; no labels needed

    `native=True` uses the framework-native twin of `optimizer` (torch.optim, Keras; the same
    name and hyperparameters) with the learning rate set per step. Backends subclass it.

    Batch normalisation trains the ONNX way, the same on every backend (training_graph.py):
    `step` and `gradients` run the model's training form, in which every BatchNormalization
    whose running mean and variance are initializers has training_mode=1: it normalises with
    the batch's mean and population variance, and its running statistics become
    running * momentum + batch * (1 - momentum) (ONNX opset >= 14). Those statistics are
    `buffer_names`, not `parameter_names`: no gradient, never seen by the optimizer, overwritten
    by every training forward (`step`, `gradients`; not `apply`). `predict` runs the model as
    written (inference form) with the running statistics as they are. The framework holds them
    as its own non-trainable state (torch buffers, tf.Variables with trainable=False, the
    reference's arrays); `buffers()`/`set_buffers()` read and write them. Models without such a
    node (MLP, LeNet-5) train exactly as before.
    """

    def __init__(self, executable: Executable, optimizer: Any, loss: str = "loss",
                 native: bool = False):
        from d500.training.optimizers.base import Optimizer
        if not isinstance(optimizer, Optimizer):
            raise UsageError(f"a trainer takes a d500 Optimizer (d500.training.optimizers."
                             f"make(name, **hp)), not {type(optimizer).__name__}")
        executable.output_index(loss)
        from d500.backends.training_graph import training_graph
        self.training = training_graph(executable.model)  # the model's training form
        buffers = self.training.updates
        # running statistics: state updated by training forwards; the rest is trained
        self.buffer_names: list[str] = list(buffers)
        self.parameter_names: list[str] = [n for n in executable.parameter_names
                                           if n not in buffers]
        if not self.parameter_names:
            raise UsageError(f"model '{executable.model.graph.name}' has no float parameters "
                             f"to train")
        self.executable, self.optimizer, self.loss, self.native = (
            executable, optimizer, loss, bool(native))
        self.input_dtypes = {
            i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            for i in executable.model.graph.input if i.name in executable.input_names
            and i.type.HasField("tensor_type") and i.type.tensor_type.elem_type}
        self.input_shapes = {
            i.name: tuple(d.dim_value if d.HasField("dim_value") else None
                          for d in i.type.tensor_type.shape.dim)
            for i in executable.model.graph.input if i.name in executable.input_names
            and i.type.HasField("tensor_type") and i.type.tensor_type.HasField("shape")}

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        """One update on the batch `feeds` (inputs by name) at learning rate `lr`; the loss."""
        raise NotImplementedError

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        """Output `output` for `feeds` without an update (only the inputs it needs are read)."""
        raise NotImplementedError

    # -- the split of `step` that distributed schemes use (level 3) -------------------------
    # `step(feeds, lr)` is unchanged and does not go through these; for plain SGD-style
    # optimizers `apply(gradients(feeds)[1], lr)` is the same update as `step(feeds, lr)`.
    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """Forward and backward on the batch `feeds`, no parameter update: (the loss, the
        gradient of every parameter by name as a writable float NumPy array of the parameter's
        shape). It is a training forward: running statistics are updated, as in `step`.
        On torch (CPU) the arrays are zero-copy views of `param.grad`, so an in-place allreduce
        on them changes what `apply` reads; elsewhere they are this call's own arrays."""
        raise NotImplementedError

    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The optimizer's update (its state advances one step) from `grads` (one array per
        parameter, by name: e.g. `gradients`' arrays after an allreduce) at learning rate `lr`.
        A missing or misshapen gradient is a UsageError naming it. Running statistics are not
        touched (the forward in `gradients` updated them)."""
        raise NotImplementedError

    def parameter_views(self) -> dict[str, np.ndarray] | None:
        """Writable NumPy arrays sharing the parameters' memory (writing one changes the model),
        or None when the framework keeps parameters where NumPy cannot see them (TensorFlow) or
        replaces its arrays on every update (reference): then use `parameters()` and
        `set_parameters()`. Views stay valid for the trainer's life."""
        return None

    def check_gradients(self, grads: Mapping[str, Any]) -> None:
        """A UsageError naming the first parameter whose gradient is missing from `grads` or
        has another shape than the parameter (the same rule for every backend's `apply`)."""
        shapes = self.parameter_shapes()
        for name, shape in shapes.items():
            g = grads.get(name)
            if g is None:
                raise UsageError(f"apply: no gradient for parameter '{name}' "
                                 f"({len(shapes)} parameters, {len(grads)} gradients given)")
            if tuple(np.shape(g)) != shape:
                raise UsageError(f"apply: the gradient of '{name}' has shape "
                                 f"{tuple(np.shape(g))}, the parameter {shape}")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape by name (from the model's initializers)."""
        found = getattr(self, "_parameter_shapes", None)
        if found is None:
            dims = {t.name: tuple(int(d) for d in t.dims)
                    for t in self.executable.model.graph.initializer}
            found = self._parameter_shapes = {n: dims[n] for n in self.parameter_names}
        return found

    def parameters(self) -> dict[str, np.ndarray]:
        """The current parameters by name, as NumPy copies (running statistics: `buffers`)."""
        values = self.executable.parameters()
        if not self.buffer_names:
            return values
        return {n: values[n] for n in self.parameter_names}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite some or all parameters by name (the optimizer state is kept)."""
        self._refuse(values, self.buffer_names, "a running statistic (a buffer): set it with "
                                                "set_buffers")
        self.executable.set_parameters(values)

    def buffers(self) -> dict[str, np.ndarray]:
        """The running statistics (BatchNormalization's mean and variance) by name, as NumPy
        copies; empty for a model without them."""
        if not self.buffer_names:
            return {}
        values = self.executable.parameters()
        return {n: values[n] for n in self.buffer_names}

    def set_buffers(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite some or all running statistics by name (e.g. rank 0's, or an average)."""
        self._refuse(values, self.parameter_names, "a parameter, not a running statistic: "
                                                   "set it with set_parameters")
        unknown = sorted(set(values) - set(self.buffer_names))
        if unknown:
            raise UsageError(f"'{unknown[0]}' is not a running statistic of this model "
                             f"(running statistics: {', '.join(self.buffer_names) or 'none'})")
        self.executable.set_parameters(values)

    @staticmethod
    def _refuse(values: Mapping[str, Any], names: Sequence[str], what: str) -> None:
        if names:
            wrong = [n for n in values if n in set(names)]
            if wrong:
                raise UsageError(f"'{wrong[0]}' is {what}")

    # -- shared by the backends' trainers ---------------------------------------------------
    def batch(self, feeds: Mapping[str, Any], needed: Sequence[str]) -> dict[str, np.ndarray]:
        """The inputs `needed` from `feeds` as contiguous arrays of the declared dtype, checked:
        a missing input, an unknown one, or a shape the model does not declare is a UsageError."""
        out = {}
        for name in needed:
            if name not in feeds:
                raise UsageError(f"input '{name}' is missing (needed: {', '.join(needed)})")
            array = np.ascontiguousarray(feeds[name], dtype=self.input_dtypes.get(name))
            declared = self.input_shapes.get(name)
            if declared is not None and (len(array.shape) != len(declared) or any(
                    d is not None and d != s for d, s in zip(declared, array.shape))):
                want = "(" + ", ".join("?" if d is None else str(d) for d in declared) + ")"
                raise UsageError(f"input '{name}' has shape {array.shape}; the model declares "
                                 f"{want}")
            out[name] = array
        if len(feeds) > len(out):
            unknown = sorted(set(feeds) - set(self.executable.input_names))
            if unknown:
                raise UsageError(f"unknown model input(s) {unknown}; the model's inputs are "
                                 f"{self.executable.input_names}")
        return out

    def needed_inputs(self, nodes: Sequence[tuple[Sequence[str], Sequence[str], Any]],
                      outputs: Sequence[str]) -> tuple[list[int], list[str]]:
        """For `outputs`: the indices of the nodes (inputs, outputs, NodeProto) they depend on
        and the graph inputs those read; an unknown output is a UsageError."""
        for name in outputs:
            self.executable.output_index(name)
        keep, read = needed_nodes(nodes, outputs)
        return keep, [n for n in self.executable.input_names if n in read]

    def native_twin(self, framework: str, params: Any) -> Any:
        """The framework-native twin of the optimizer over `params` (ConfigError if none)."""
        from d500.training.optimizers.native import native
        from d500.training.optimizers.registry import OPTIMIZERS
        if OPTIMIZERS.get(self.optimizer.name) is not type(self.optimizer):
            raise UsageError(f"optimizer '{self.optimizer.name}' ({type(self.optimizer).__name__})"
                             f" is not a built-in one: it has no framework-native twin")
        return native(framework, self.optimizer.name, params, **self.optimizer.hp)


def needed_nodes(nodes: Sequence[tuple[Sequence[str], Sequence[str], Any]],
                 outputs: Sequence[str]) -> tuple[list[int], set[str]]:
    """The indices of the nodes, given as (inputs, outputs, NodeProto) in execution order, that
    `outputs` depend on, and every name those nodes read (subgraphs' outer names included)."""
    need, keep = set(outputs), []
    for i in range(len(nodes) - 1, -1, -1):
        ins, outs, proto = nodes[i]
        if any(o in need for o in outs if o):
            keep.append(i)
            need.update(n for n in ins if n)
            need.update(outer_reads(proto))
    return keep[::-1], need


def outer_reads(proto: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of a node read from the scope around it."""
    names: set[str] = set()
    for a in proto.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for inner in g.node:
                names.update(n for n in [*inner.input, *outer_reads(inner)]
                             if n and n not in defined)
                defined.update(inner.output)
            names.update(o.name for o in g.output if o.name not in defined)
    return names


class Backend(onnx.backend.base.Backend):
    """A framework backend, found by name in the `d500.backends` entry-point group."""

    name: ClassVar[str] = "?"
    # The distribution of the framework it runs on, whose version is provenance. A backend that
    # d500.backends.FRAMEWORKS knows gets it from there; a third-party one sets it on its class.
    framework: ClassVar[str] = "?"
    trainable: ClassVar[bool] = True  # False for inference-only peers

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        from d500.backends import framework
        known = framework(cls.name)
        if known is not None and "framework" not in vars(cls):
            cls.framework = known[1]

    @classmethod
    def version(cls) -> str:
        """The version of the framework this backend runs on: its distribution's, else (another
        distribution provides the module, e.g. tensorflow for tensorflow-cpu) the module's."""
        import sys
        from importlib.metadata import PackageNotFoundError, version

        from d500.backends import framework
        try:
            return version(cls.framework)
        except PackageNotFoundError:
            known = framework(cls.name)
            module = sys.modules.get(known[0]) if known is not None else None
            return str(getattr(module, "__version__", "?"))

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str, device: str = "CPU",
                **kwargs: Any) -> Executable:
        from d500.model import load
        model = load(model)
        if not cls.supports_device(device):
            raise UsageError(f"backend '{cls.name}' cannot run on device {device}")
        return cls._prepare(model, device, **kwargs)

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        raise NotImplementedError

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> list[np.ndarray]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> list[np.ndarray]:
        """Run one node on NumPy inputs by wrapping it in a one-node model."""
        return cls.prepare(node_model(node, inputs, outputs_info,
                                      kwargs.get("opset_version")), device).run(
            [np.asarray(x) for x in (inputs.values() if isinstance(inputs, Mapping)
                                     else inputs)])


def node_model(node: onnx.NodeProto, inputs: Any,
               outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
               opset: int | None = None) -> onnx.ModelProto:
    """A one-node ModelProto whose inputs have the dtypes and shapes of the given arrays."""
    values = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
    names = [n for n in node.input if n]
    graph_inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.asarray(v).shape)
        for name, v in zip(names, values)]
    if outputs_info:
        graph_outputs = [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                          shape)
            for name, (dt, shape) in zip(node.output, outputs_info)]
    else:
        graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
    imports = [helper.make_opsetid(node.domain or "", opset or onnx.defs.onnx_opset_version())]
    model = helper.make_model(graph, opset_imports=imports)
    if not outputs_info:
        _type_outputs(model, dict(zip(names, values)))
    return model


def _type_outputs(model: onnx.ModelProto, feeds: dict[str, Any]) -> None:
    """Give a one-node model's outputs the types the checker requires: by shape inference, else
    from running the node on the given inputs with onnx's ReferenceEvaluator."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.output
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model.graph.output
    if all(o.type.tensor_type.HasField("shape") or o.type.WhichOneof("value") not in (
            None, "tensor_type") for o in inferred):
        model.graph.ClearField("output")
        model.graph.output.extend(inferred)
        return
    try:
        from onnx.reference import ReferenceEvaluator
        values = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001 - leave the outputs untyped: the backend reports the op
        return
    for out, value in zip(model.graph.output, values):
        if isinstance(value, np.ndarray):
            out.CopyFrom(helper.make_tensor_value_info(
                out.name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))


def _is_float(value: Any) -> bool:
    """A float tensor (NumPy dtype kind "f"): what gradients are taken with respect to."""
    dtype = getattr(value, "dtype", None)
    return (dtype if isinstance(dtype, np.dtype) else np.asarray(value).dtype).kind == "f"


def to_numpy(tensor: onnx.TensorProto) -> np.ndarray:
    """A TensorProto as a NumPy array (external data already loaded)."""
    return numpy_helper.to_array(tensor)
