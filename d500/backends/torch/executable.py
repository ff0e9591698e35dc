"""The torch backend: an ONNX graph as a torch.nn.Module; its forward walks the op table."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from d500.backends.base import Backend, Executable, to_numpy
from d500.backends.graph import Node, Program
from d500.backends.torch import (
    activations,
    control,
    conv,
    detection,
    image,
    indexing,
    linalg,
    math,
    normalization,
    pooling,
    preview_training,
    reduce,
    rnn,
    shape,
    softmax,
    spectral,
    strings,
)
from d500.backends.torch.dtypes import from_numpy
from d500.backends.torch.dtypes import to_numpy as tensor_to_numpy
from d500.backends.torch.framework import FRAMEWORK
from d500.backends.trainer_base import Trainer
from d500.backends.training_graph import running_statistics
from d500.errors import D500Error, UsageError

# The op table: ONNX op type (prefixed by "domain::" outside the default domain) -> function.
OPS = {**math.OPS, **activations.OPS, **softmax.OPS, **conv.OPS, **pooling.OPS,
       **normalization.OPS, **shape.OPS, **indexing.OPS, **reduce.OPS, **linalg.OPS,
       **control.OPS, **image.OPS, **rnn.OPS, **spectral.OPS, **strings.OPS, **detection.OPS,
       **preview_training.OPS}


def _nodes(program: Program) -> Iterator[Node]:
    """Every node of a program, subgraphs included."""
    for node, _ in program.steps:
        yield node
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Program):
                    yield from _nodes(sub)


def _subgraph_reads(node: Node) -> set[str]:
    """Outer-scope names the subgraphs of a node read (they count as reads of the node)."""
    names: set[str] = set()
    for value in node.attrs.values():
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, Program):
                defined = set(sub.input_names) | set(sub.initializers)
                for inner, _ in sub.steps:
                    names.update(n for n in inner.inputs if n and n not in defined)
                    names.update(n for n in _subgraph_reads(inner) if n not in defined)
                    defined.update(inner.outputs)
                names.update(n for n in sub.output_names if n not in defined)
    return names


class Plan:
    """The top-level steps of a program with, per step, the values no later step reads.

    Running it frees every intermediate value after its last use, as eager torch code does:
    holding all activations to the end costs memory traffic and fresh allocations.
    """

    def __init__(self, program: Program):
        self.program = program
        steps = program.steps
        keep = set(program.output_names)
        last: dict[str, int] = {}
        for i, (node, _) in enumerate(steps):
            for name in [*node.inputs, *_subgraph_reads(node)]:
                if name:
                    last[name] = i
        dead: list[list[str]] = [[] for _ in steps]
        for name, i in last.items():
            if name not in keep:
                dead[i].append(name)
        self.steps = [(node, fn, node.inputs, node.outputs, tuple(d))
                      for (node, fn), d in zip(steps, dead)]
        self.output_names = program.output_names

    def run(self, env: dict[str, Any]) -> list[Any]:
        program = self.program
        saved, program.scope = program.scope, env
        node = None
        try:
            for node, fn, inputs, outputs, dead in self.steps:
                out = fn(node, *[env[n] if n else None for n in inputs])
                if type(out) is not tuple:
                    out = (out,)
                for name, value in zip(outputs, out):
                    if name:
                        env[name] = value
                for name in dead:
                    env.pop(name, None)
            return [env[name] for name in self.output_names]
        except D500Error:
            raise
        except (RuntimeError, ValueError, IndexError, TypeError) as err:
            where = f"node '{node.name or '<unnamed>'}' ({node.op_type})" if node else "the graph"
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UsageError(f"backend 'torch': {where} failed: {first}") from err
        finally:
            program.scope = saved


def _elem_type(type_proto: onnx.TypeProto) -> int:
    """The tensor element type inside a (sequence/optional of) tensor type; 0 if unknown."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return type_proto.tensor_type.elem_type
    if kind == "sequence_type":
        return _elem_type(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _elem_type(type_proto.optional_type.elem_type)
    return 0


class GraphModule(torch.nn.Module):
    """The ONNX graph as a module: float initializers are parameters, the rest buffers (among
    them BatchNormalization's running statistics, as torch's own batch norm keeps them)."""

    def __init__(self, program: Program, initializers: Mapping[str, np.ndarray],
                 trainable: set[str], input_names: Sequence[str], device: torch.device):
        super().__init__()
        self.program = program
        self.plan = Plan(program)
        self.input_names = list(input_names)
        self.attr_names: dict[str, str] = {}
        self.constants: dict[str, Any] = {}
        for i, (name, array) in enumerate(initializers.items()):
            value = from_numpy(array, device)
            if not isinstance(value, torch.Tensor):
                self.constants[name] = value  # strings
                continue
            # in torch's own memory: 64-byte aligned, as oneDNN's kernels want (NumPy's is
            # 16-byte aligned: a convolution's forward+backward on such weights runs ~4% slower)
            value = value.clone()
            attr = f"v{i}_" + re.sub(r"\W", "_", name)[:60]
            self.attr_names[name] = attr
            if name in trainable:
                self.register_parameter(attr, torch.nn.Parameter(value))
            else:
                self.register_buffer(attr, value)
        self.values: dict[str, Any] = {}
        self._refresh()

    def _refresh(self) -> None:
        self.values = {name: getattr(self, attr) for name, attr in self.attr_names.items()}
        self.values.update(self.constants)

    def _apply(self, fn, recurse=True):  # keep the name -> tensor map valid across .to(...)
        out = super()._apply(fn, recurse)
        self._refresh()
        return out

    def forward(self, *inputs: Any, **named: Any) -> list[Any]:
        feeds = dict(self.values)
        feeds.update(zip(self.input_names, inputs))
        feeds.update(named)
        return self.plan.run(feeds)


def translate(model: onnx.ModelProto, device: torch.device) -> Program:
    """The model's graph as a Program on the torch op table, its nodes placed on `device`."""
    opsets = {imp.domain or "": imp.version for imp in model.opset_import}
    functions = {(f.domain, f.name): f for f in model.functions}
    program = Program(model.graph, opsets, OPS, "torch", functions=functions)
    for node in _nodes(program):
        node.device = device  # type: ignore[attr-defined]
        if node.op_type == "Constant" and node.domain == "":
            OPS["Constant"](node)  # cache now, outside inference mode
    return program


def exact_float32() -> None:
    """float32 as float32 on CUDA: cuDNN's convolutions default to TF32 (10-bit mantissa), which
    moved light ResNet-50's logits by 2e-3 relative on an H100 (1.6e-6 without); judged float32
    must not be computed in a narrower type."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


class TorchExecutable(Executable):
    backend_name = "torch"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        super().__init__(model, device)
        self.torch_device = torch.device("cuda" if device.upper().startswith("CUDA") else "cpu")
        if self.torch_device.type == "cuda":
            exact_float32()
        program = translate(model, self.torch_device)
        initializers = {t.name: to_numpy(t) for t in model.graph.initializer}
        self.buffer_names = running_statistics(model)
        trainable = set(self.parameter_names) - set(self.buffer_names)
        self._module = GraphModule(program, initializers, trainable, self.input_names,
                                   self.torch_device)
        types = dict(program.types)
        self.output_types = [_elem_type(types[n]) if n in types else 0 for n in self.output_names]
        self.input_shapes = {
            i.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input
            if i.type.HasField("tensor_type") and i.type.tensor_type.HasField("shape")}
        self._shapes_ok: set[tuple[str, tuple[int, ...]]] = set()
        self._parameter_set = frozenset(self.parameter_names)

    # -- running ----------------------------------------------------------------------------
    def _feeds(self, inputs: Any, requires_grad: set[str] = frozenset(),
               bound: bool = False) -> dict[str, Any]:
        """The inputs as tensors by name (`bound`: `inputs` is bind()'s dict already)."""
        feeds = {}
        device = self.torch_device
        for name, value in (inputs if bound else self.bind(inputs)).items():
            self._check_shape(name, value)
            tensor = from_numpy(value, device)
            if name in requires_grad and isinstance(tensor, torch.Tensor):
                tensor = tensor.detach().requires_grad_(True)  # no copy: autograd reads it
            feeds[name] = tensor
        return feeds

    def _check_shape(self, name: str, value: Any) -> None:
        """An input whose rank or fixed sizes differ from the graph's declaration is refused
        (each name and shape checked once: the shapes found right are remembered)."""
        declared = self.input_shapes.get(name)
        if declared is None:
            return
        shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
        if (name, shape) in self._shapes_ok:
            return
        if len(shape) != len(declared) or any(
                d is not None and d != s for d, s in zip(declared, shape)):
            want = "(" + ", ".join("?" if d is None else str(d) for d in declared) + ")"
            raise UsageError(f"input '{name}' has shape {tuple(shape)}; the model declares {want}")
        if len(self._shapes_ok) < 64:  # a bounded memory: a varying batch size stays checked
            self._shapes_ok.add((name, shape))

    def _outputs(self, values: Sequence[Any]) -> list[Any]:
        return [tensor_to_numpy(v, t) for v, t in zip(values, self.output_types)]

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        feeds = self._feeds(inputs)
        with torch.inference_mode():
            return self._outputs(self._module(**feeds))

    # -- training hooks ---------------------------------------------------------------------
    def parameters(self) -> dict[str, np.ndarray]:
        values = self._module.values
        return {name: tensor_to_numpy(values[name]).copy() for name in self.parameter_names}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        current = self._module.values
        with torch.no_grad():
            for name, value in values.items():
                target = current.get(name)
                new = from_numpy(self.parameter_value(name, value, target), self.torch_device)
                target.copy_(new.to(target.dtype))

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        seeds = {self.output_index(name): g for name, g in (grad_outputs or {}).items()}
        index = None if seeds else self.output_index(output or self.output_names[0])
        with torch.enable_grad():
            outs, wanted, targets = self._graph(inputs, wrt)
            seed = None
            if len(seeds) <= 1:
                i, g = next(iter(seeds.items()), (index, None))
                seed = _seed(outs[i], g, self.torch_device)
            if seed is not None:  # d(out . seed)/d out is the seed itself: no multiply, no sum
                grads = torch.autograd.grad(outs[i], targets, seed, allow_unused=True)
            else:
                loss = sum((outs[i] * from_numpy(np.asarray(g), self.torch_device)).sum()
                           for i, g in seeds.items()) if seeds else outs[index].sum()
                grads = torch.autograd.grad(loss, targets, allow_unused=True)
        return self._outputs(outs), _named(wanted, targets, grads)

    def kept(self, inputs: Any, wrt: Sequence[str] | None = None
             ) -> tuple[list[np.ndarray], Any, int]:
        """The forward's autograd graph kept until backward (no second forward); bytes held:
        the tensors the graph saved that are not parameters, each once."""
        if type(self).gradients is not TorchExecutable.gradients:  # a mode of its own (compiled)
            return super().kept(inputs, wrt)
        own = {v.data_ptr() for v in self._module.values.values() if isinstance(v, torch.Tensor)}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in own:
                saved[t.data_ptr()] = t.nbytes
            return t
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs, wanted, targets = self._graph(inputs, wrt)

        def backward(grad_outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            ys = [outs[self.output_index(n)] for n in grad_outputs]
            gs = [from_numpy(np.asarray(g), self.torch_device) for g in grad_outputs.values()]
            return _named(wanted, targets, torch.autograd.grad(ys, targets, gs,
                                                               allow_unused=True))
        return self._outputs(outs), backward, sum(saved.values())

    def _graph(self, inputs: Any, wrt: Sequence[str] | None) -> tuple[Any, list[str], list[Any]]:
        """The forward under autograd: (outputs, the names differentiated, their tensors)."""
        bound = self.bind(inputs)
        wanted = self.gradient_targets(bound, wrt)
        params = self._parameter_set
        feeds = self._feeds(bound, {n for n in wanted if n not in params}, bound=True)
        values = self._module.values
        for name in self.buffer_names:  # a running statistic, differentiated
            if name in wanted:
                feeds[name] = values[name].detach().requires_grad_(True)
        outs = self._module(**feeds)
        return outs, wanted, [feeds[n] if n in feeds else values[n] for n in wanted]

    @property
    def native(self) -> GraphModule:
        return self._module

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Trainer:
        from d500.backends.torch.trainer import TorchTrainer
        return TorchTrainer(self, optimizer, loss, native, self.check_precision(precision))


def _seed(out: Any, g: Any, device: torch.device) -> Any:
    """The gradient of `out` that `(out * g).sum()` gives it, when that is `g` itself as a
    tensor of out's shape and dtype (ones where g is None: `out.sum()`); else None."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    if g is None:
        return torch.ones_like(out)
    g = np.asarray(g)
    if tuple(g.shape) != tuple(out.shape):
        return None
    seed = from_numpy(g, device)
    return seed if isinstance(seed, torch.Tensor) and seed.dtype == out.dtype else None


# dtypes whose gradient tensor is NumPy's as it is (Tensor.numpy(): a view, no copy)
_PLAIN = {torch.float32, torch.float64, torch.float16}


def _named(wanted: list[str], targets: list[Any], grads: Sequence[Any]) -> dict[str, np.ndarray]:
    """Gradients by name as NumPy; zeros for a target the outputs do not depend on."""
    out = {}
    for name, t, g in zip(wanted, targets, grads):
        if g is None:
            out[name] = np.zeros(t.shape, dtype=tensor_to_numpy(t).dtype)
        elif g.dtype in _PLAIN and g.device.type == "cpu" and not g.requires_grad:
            out[name] = g.numpy()
        else:
            out[name] = tensor_to_numpy(g)
    return out


class TorchBackend(Backend):
    name = "torch"
    about = FRAMEWORK.about
    modes = FRAMEWORK.modes

    @classmethod
    def compiled_programs(cls) -> set[str] | None:
        if cls.mode != "compiled":
            return None
        from d500.backends.torch.compile_cache import snapshot
        return snapshot(entries=True)  # the worker's cache: what the judge compiled is not it

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            return torch.cuda.is_available()
        return super().supports_device(device)

    @classmethod
    def precisions(cls, device: str = "CPU") -> tuple[str, ...]:
        """autocast: bf16 on a CPU; fp16 (with dynamic loss scaling) and bf16 on CUDA (the
        compiled mode's training step: fp32)."""
        if cls.mode == "compiled":
            return ("fp32",)
        if str(device).upper().startswith("CUDA"):
            return ("fp32", "bf16", "fp16")
        return ("fp32", "bf16")

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        if cls.mode == "compiled":
            from d500.backends.torch.compiled import CompiledExecutable
            return CompiledExecutable(model, device)
        return TorchExecutable(model, device)
