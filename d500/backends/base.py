"""The backend contract: Backend (an onnx.backend.base.Backend) and Executable (a BackendRep
with training hooks); a prepared model's Trainer is in trainer_base.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx.backend.base
import onnx.shape_inference
from onnx import helper, numpy_helper

from d500.backends.trainer_base import Trainer
from d500.errors import UsageError, did_you_mean


class Executable(onnx.backend.base.BackendRep):
    """A prepared model: run it, read/set its parameters, differentiate it, reach its native object.

    `run(inputs)` takes a list in graph-input order (inputs that are not initializers) or a
    dict by name, and returns a list of NumPy arrays in graph-output order.
    """

    backend_name: ClassVar[str] = "?"
    # The dtype a mode computes the model's float32 tensors in when it is lower (an OpenVINO
    # bf16 mode: "bfloat16"); its outputs are then judged at that dtype's tolerance. None: the
    # model's own dtypes.
    precision: str | None = None

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        self.model = model
        self.device = device
        init_names = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init_names]
        self._feedable = frozenset(self.input_names) | init_names  # what bind() takes by name
        self.output_names = [o.name for o in model.graph.output]
        self.parameter_names = [
            t.name for t in model.graph.initializer
            if onnx.helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]

    # -- inputs ---------------------------------------------------------------
    def bind(self, inputs: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
        """Name the given inputs: a list in graph-input order or a dict by name."""
        if isinstance(inputs, Mapping):
            unknown = inputs.keys() - self._feedable
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

    def kept(self, inputs: Any, wrt: Sequence[str] | None = None
             ) -> tuple[list[np.ndarray], Any, int]:
        """Forward now, backward later (a pipeline stage): (outputs, backward, bytes held),
        where backward(grad_outputs) gives `gradients(inputs, grad_outputs=..., wrt=wrt)`'s
        gradients. Here backward runs the forward again from `inputs` (re-materialisation: only
        the inputs are held); a backend that can keep its graph of the forward overrides this
        and holds what the graph saved instead."""
        outs = self.run(inputs)
        held = sum(np.asarray(v).nbytes for v in
                   (inputs.values() if isinstance(inputs, Mapping) else inputs))
        return outs, lambda grad_outputs: self.gradients(
            inputs, grad_outputs=grad_outputs, wrt=wrt)[1], held

    @property
    def native(self) -> Any:
        """The framework's own object (torch.nn.Module, tf.Module, ...)."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """What the framework says its mode's settings are, once the model is prepared (the
        graph optimization level, the inference precision it actually runs): recorded with a
        level-1 run. Empty when the backend has nothing to say."""
        return {}

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Trainer:
        """A Trainer of this model on its backend: minimise the scalar output `loss` with the
        framework-neutral d500 `optimizer` (native=True: its framework-native twin instead),
        its linear layers computing in `precision` (d500.training.precision; the backend's
        `precisions` say which it can). An inference-only backend has none: a UsageError
        naming it."""
        from d500.backends import trainable
        raise UsageError(f"backend '{self.backend_name}' is inference-only: it cannot train "
                         f"(train on a trainable backend: {', '.join(trainable())})")

    def check_precision(self, precision: str) -> str:
        """`precision` when this backend can train in it on this device, else a UsageError."""
        from d500 import backends
        from d500.training.precision import check_backend
        check_backend(precision, backends.get(self.backend_name), self.device)
        return precision


class InferenceOnly(Executable):
    """An inference-only backend's executable (onnxruntime, OpenVINO): its parameters are the
    model's float initializers as written; it neither sets nor differentiates them."""

    def parameters(self) -> dict[str, np.ndarray]:
        wanted = set(self.parameter_names)
        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer
                if t.name in wanted}

    def set_parameters(self, values: Any) -> None:
        raise UsageError(self._refused("settable parameters"))

    def gradients(self, inputs: Any, **kwargs: Any):
        raise UsageError(self._refused("gradients"))

    def _refused(self, what: str) -> str:
        return (f"backend '{self.backend_name}' is inference-only in d500: it has no {what}; "
                f"use the reference, torch or tensorflow backend")


class Backend(onnx.backend.base.Backend):
    """A framework backend, found by name in the `d500.backends` entry-point group."""

    name: ClassVar[str] = "?"  # "framework" for its default mode, "framework:mode" otherwise
    # The distribution of the framework it runs on, whose version is provenance. A registered
    # backend gets it from its FRAMEWORK (d500.backends.about); a third-party one may set it here.
    framework: ClassVar[str] = "?"
    trainable: ClassVar[bool] = True  # False for inference-only peers
    # A backend is a framework and a mode. The class registered under the framework's name is
    # its default mode (mode ""), `about` says in one line what that is; `modes` names the
    # framework's other modes, each with its one line. `in_mode` gives the class of another
    # mode (a subclass whose `name` is "framework:mode"), which `_prepare` reads as `cls.mode`.
    mode: ClassVar[str] = ""
    about: ClassVar[str] = ""
    modes: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        from d500.backends import framework
        known = framework(cls.name)
        if known is not None and "framework" not in vars(cls):
            cls.framework = known[1]

    @classmethod
    def default_mode(cls) -> type[Backend]:
        """The class of the framework's default mode (this class when it is that mode)."""
        return next(c for c in cls.__mro__ if issubclass(c, Backend) and not c.mode)

    @classmethod
    def mode_names(cls) -> dict[str, str]:
        """Every mode of the framework by its full backend name, the default first, each with
        its one line."""
        base = cls.default_mode()
        return {base.name: base.about, **{f"{base.name}:{m}": about
                                          for m, about in base.modes.items()}}

    @classmethod
    def in_mode(cls, mode: str) -> type[Backend]:
        """The backend class of the framework's mode `mode` ("" the default); an unknown mode is
        a UsageError naming the framework's modes."""
        base = cls.default_mode()
        if not mode:
            return base
        if mode not in base.modes:
            near = did_you_mean(mode, [m for m in base.modes if m])  # judged on the mode alone
            hint = "; " + near.replace("'", f"'{base.name}:", 1) if near else ""
            raise UsageError(f"unknown backend mode '{base.name}:{mode}' (the modes of "
                             f"{base.name}: {', '.join(base.mode_names())}{hint})")
        made = _MODES.get((base, mode))
        if made is None:
            made = _MODES[base, mode] = type(
                f"{base.__name__}_{mode}", (base,),
                {"name": f"{base.name}:{mode}", "mode": mode, "about": base.modes[mode],
                 "modes": {}, "__module__": base.__module__,
                 "__qualname__": f"{base.__qualname__}_{mode}"})
        return made

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
    def precision(cls) -> str | None:
        """The lower dtype this mode computes float32 tensors in, at whose tolerance its outputs
        are judged (its Executables' `precision`); None: the model's own dtypes."""
        return None

    @classmethod
    def compiled_programs(cls) -> set[str] | None:
        """The programs this mode's compile cache (an entry's worker's) holds now, by key
        (d500.training.compiling marks a run warm with them); None for a mode that does not
        compile."""
        return None

    @classmethod
    def traces_step(cls) -> bool:
        """Whether this mode traces or compiles its training step on its first call (a
        tf.function, jax.jit, Inductor): work d500 keeps on the clock, so nothing warms the
        mode up before it (d500.training.warmup)."""
        return cls.compiled_programs() is not None

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
    def precisions(cls, device: str = "CPU") -> tuple[str, ...]:
        """The precisions its trainer can train in on `device` (d500.training.precision)."""
        return ("fp32",)

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


_MODES: dict[tuple[type[Backend], str], type[Backend]] = {}  # made once: one class per mode


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


def output_to_numpy(t: onnx.TypeProto | None, value: Any,
                    convert: Callable[[Any, onnx.TypeProto | None], Any]) -> Any:
    """An output's value by its declared type `t`: a sequence as a list, an empty optional as
    None, each tensor through the backend's `convert(value, its type)`."""
    if isinstance(value, list):
        elem = t.sequence_type.elem_type if t is not None and t.HasField(
            "sequence_type") else None
        return [convert(v, elem) for v in value]
    if t is not None and t.HasField("optional_type"):
        if value is None:
            return None
        inner = t.optional_type.elem_type
        if isinstance(value, list):
            elem = inner.sequence_type.elem_type if inner.HasField("sequence_type") else None
            return [convert(v, elem) for v in value]
        return convert(value, inner)
    return convert(value, t)


def as_declared(a: np.ndarray, t: onnx.TypeProto | None) -> np.ndarray:
    """A numeric output in the NumPy dtype its declared tensor type names (as it is where the
    type declares none, or one NumPy lacks)."""
    if t is not None and t.HasField("tensor_type") and t.tensor_type.elem_type and (
            a.dtype.kind != "O"):
        try:
            want = helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type)
        except (KeyError, ValueError):
            return a
        if a.dtype != want:
            a = a.astype(want)
    return np.asarray(a)
