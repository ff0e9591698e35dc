"""TensorFlowExecutable: an ONNX graph run as a tf.function over a tf.Module holding its weights.

Float initializers become tf.Variables of the module (the native object); other initializers are
constants of the traced function. Graph inputs whose *values* decide shapes (a Reshape target,
Slice starts, Pad pads, axes, a Loop trip count, ...) are baked into the trace as constants and
the function is retraced once per distinct value, so every shape is static while tracing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import tensorflow as tf
from onnx import helper

from d500.backends.base import Backend, Executable, as_declared, output_to_numpy, to_numpy
from d500.backends.graph import Program
from d500.backends.tensorflow.core import SHAPE_INPUTS, plain, tensor
from d500.backends.tensorflow.framework import FRAMEWORK, start_xla
from d500.backends.tensorflow.ops import OPS
from d500.backends.trainer_base import Trainer
from d500.backends.training_graph import running_statistics
from d500.errors import ModelError, UnsupportedOperator, UsageError

# After a trace fails for want of a static value, integer inputs up to _BAKE_LIMIT elements and
# other inputs up to _BAKE_SMALL elements are baked too (e.g. Range's limits in its expansion).
_BAKE_LIMIT, _BAKE_SMALL = 4096, 16
# XLA's refusal: "Detected unsupported operations when trying to compile graph ... : Where (No
# registered 'Where' OpKernel for XLA_CPU_JIT devices ...)"
_XLA_REFUSED = re.compile(r"Detected unsupported operations when trying to compile graph[^:]*:"
                          r"(.*)", re.S)
_XLA_OP = re.compile(r"No registered '(\w+)' OpKernel")


class OnnxModule(tf.Module):
    """The native object: the model's trainable parameters as tf.Variables; call it on inputs."""

    def __init__(self, executable: TensorFlowExecutable, params: Mapping[str, np.ndarray],
                 frozen: set[str] = frozenset()):
        super().__init__(name=re.sub(r"\W", "_", executable.model.graph.name or "onnx") or "onnx")
        # running statistics (`frozen`) are non-trainable variables, as Keras' BatchNormalization
        # keeps them: a training step assigns them, no optimizer sees them
        self.params = {k: tf.Variable(v, name=re.sub(r"[^\w.-]", "_", k) or "p",
                                      trainable=k not in frozen)
                       for k, v in params.items()}
        self._executable = executable

    def __call__(self, inputs: Any) -> list[tf.Tensor]:
        """The graph outputs as tensors (differentiable with a tf.GradientTape)."""
        exe = self._executable
        if isinstance(inputs, (tf.Tensor, tf.Variable, np.ndarray)):
            inputs = [inputs]
        feeds, baked = exe._split(exe.bind(inputs))
        if tf.inside_function():
            # traced into the caller's graph: no nested function call, whose gradient would
            # run as a separate forward (returning every intermediate) and backward function
            return exe._call(feeds, baked)
        return exe._function(feeds, baked)


def translate(model: onnx.ModelProto) -> Program:
    """The model's graph as a Program on the TensorFlow op table."""
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version
              for o in model.opset_import}
    functions = {(f.domain, f.name): f for f in model.functions}
    return Program(model.graph, opsets, OPS, "tensorflow", functions=functions)


class TensorFlowExecutable(Executable):
    backend_name = "tensorflow"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", xla: bool = False):
        super().__init__(model, device)
        # tensorflow:xla compiles every tf.function with XLA (jit_compile=True); the default
        # mode leaves TensorFlow its own choice, as before modes existed
        self._jit = {"jit_compile": True} if xla else {}
        if xla:
            start_xla()  # its compile pool on the recorded threads' cores
        self._device = "/GPU:0" if device.upper().startswith("CUDA") else "/CPU:0"
        self.program = translate(model)
        wanted = set(self.parameter_names)
        arrays = {t.name: to_numpy(t) for t in model.graph.initializer}
        self._constants = {k: v for k, v in arrays.items() if k not in wanted}
        with tf.device(self._device):
            self._module = OnnxModule(self, {k: arrays[k] for k in self.parameter_names},
                                      set(running_statistics(model)))
        self._bake = _shape_inputs(self.program) & set(self.input_names)
        self._output_types = {o.name: o.type for o in model.graph.output}
        self._input_dtypes = {
            i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            for i in model.graph.input if i.type.HasField("tensor_type")
            and i.type.tensor_type.elem_type}
        self._function = tf.function(self._call, autograph=False, **self._jit)
        # one tf.function per (output, grad-output names, wrt): its Python arguments are then
        # tensors only (a tuple of ~80 names as an argument cost ~1 ms of trace-type checks a call)
        self._grad_functions: dict[tuple, Any] = {}

    # -- tracing ------------------------------------------------------------------------
    def _split(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], tuple]:
        """Feeds as tensors, and the baked (shape-deciding) inputs as a hashable key."""
        dynamic, baked = {}, []
        for name, value in feeds.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "V":
                value = value.view(self._input_dtypes[name])  # raw 16-bit words: bfloat16
            if name in self._bake and value is not None and not isinstance(value, list):
                a = np.asarray(value)
                baked.append((name, a.dtype, a.shape, a.tobytes()))
            else:
                dynamic[name] = _to_tensor(value)
        return dynamic, tuple(sorted(baked))

    def _run_program(self, feeds: Mapping[str, Any], baked: tuple) -> list[Any]:
        env: dict[str, Any] = {k: tf.constant(v) for k, v in self._constants.items()}
        env.update(self._module.params)
        for name, dtype, shape, raw in baked:
            env[name] = tf.constant(np.frombuffer(raw, dtype=dtype).reshape(shape))
        env.update(feeds)
        return [plain(v) for v in self.program.run(env)]

    def _call(self, feeds: dict[str, Any], baked: tuple) -> list[Any]:
        with tf.device(self._device):
            return self._run_program(feeds, baked)

    def _grad_function(self, output: str | None, grad_names: tuple[str, ...],
                       wrt: tuple[str, ...]):
        """The tf.function computing the outputs and the gradients of `output` (or of the given
        output gradients, by name) with respect to `wrt`; its arguments are feeds, baked key and
        the output gradients."""
        key = (output, grad_names, wrt)
        fn = self._grad_functions.get(key)
        if fn is None:
            fn = self._grad_functions[key] = tf.function(
                lambda feeds, baked, grad_outputs: self._call_grad(
                    feeds, baked, output, grad_outputs, wrt), autograph=False, **self._jit)
        return fn

    def _call_grad(self, feeds: dict[str, Any], baked: tuple, output: str | None,
                   grad_outputs: dict[str, tf.Tensor], wrt: tuple[str, ...]):
        with tf.device(self._device):
            watched = [feeds[n] for n in wrt if n in feeds]
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(watched)
                tape.watch([self._module.params[n] for n in wrt if n in self._module.params])
                outs = self._run_program(feeds, baked)
                by_name = dict(zip(self.output_names, outs))
                if grad_outputs:
                    target = tf.add_n([tf.reduce_sum(by_name[k] * tf.cast(g, by_name[k].dtype))
                                       for k, g in grad_outputs.items()])
                else:
                    target = tf.reduce_sum(by_name[output or self.output_names[0]])
            sources = [feeds[n] if n in feeds else self._module.params[n] for n in wrt]
            grads = tape.gradient(target, sources)
            grads = [tf.zeros_like(s) if g is None else tf.convert_to_tensor(g)
                     for s, g in zip(sources, grads)]
            return outs, grads

    def _traced(self, fn, feeds: Mapping[str, Any], *args: Any):
        dynamic, baked = self._split(feeds)
        try:
            return fn(dynamic, baked, *args)
        except tf.errors.InvalidArgumentError as err:
            if self._jit and (m := _XLA_REFUSED.search(str(err))):
                ops = sorted(set(_XLA_OP.findall(m.group(1)))) or ["?"]
                raise ModelError(f"model '{self.model.graph.name}': XLA cannot compile the "
                                 f"TensorFlow operation(s) {', '.join(ops)} it translates to "
                                 f"(backend 'tensorflow:xla'; the mode 'tensorflow' runs "
                                 f"them)") from None
            raise
        except UnsupportedOperator as err:
            if "must be known when the graph is traced" not in str(err):
                raise
            extra = {n for n, v in feeds.items() if isinstance(v, np.ndarray) and (
                v.dtype.kind in "iu" and v.size <= _BAKE_LIMIT or v.dtype.kind in "fb"
                and v.size <= _BAKE_SMALL)} - self._bake
            if not extra:
                raise
            self._bake |= extra  # small inputs that reach a shape through other operators
            dynamic, baked = self._split(feeds)
            return fn(dynamic, baked, *args)

    # -- the contract ---------------------------------------------------------------------
    def run(self, inputs: Any, **kwargs: Any) -> list[Any]:
        outs = self._traced(self._function, self.bind(inputs))
        return [self._to_numpy(name, o) for name, o in zip(self.output_names, outs)]

    def parameters(self) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self._module.params.items()}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            var = self._module.params.get(name)
            new = self.parameter_value(name, value, var)
            var.assign(new.astype(var.dtype.as_numpy_dtype))

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        feeds = self.bind(inputs)
        for name in grad_outputs or [output or self.output_names[0]]:
            self.output_index(name)
        wrt = self.gradient_targets(feeds, wrt)
        for name in wrt:
            if name in self._bake:
                raise UsageError(f"cannot differentiate with respect to '{name}': "
                                 f"it decides a shape")
        g_out = {k: tf.convert_to_tensor(v) for k, v in (grad_outputs or {}).items()}
        fn = self._grad_function(None if g_out else output, tuple(sorted(g_out)), tuple(wrt))
        outs, grads = self._traced(fn, feeds, g_out)
        return ([self._to_numpy(n, o) for n, o in zip(self.output_names, outs)],
                {n: g.numpy() for n, g in zip(wrt, grads)})

    @property
    def native(self) -> OnnxModule:
        return self._module

    def settings(self) -> dict[str, Any]:
        return {"jit_compile": bool(self._jit)}

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Trainer:
        from d500.backends.tensorflow.trainer import TensorFlowTrainer
        return TensorFlowTrainer(self, optimizer, loss, native, program=self.program,
                                 precision=self.check_precision(precision),
                                 constants=self._constants, device=self._device,
                                 baked=self._bake, to_numpy=self._to_numpy, jit=self._jit)

    # -- outputs ------------------------------------------------------------------------------
    def _to_numpy(self, name: str, value: Any) -> Any:
        return output_to_numpy(self._output_types.get(name), value, self._convert)

    @staticmethod
    def _convert(value: Any, t: onnx.TypeProto | None) -> np.ndarray:
        a = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if a.dtype.kind in "SO":
            return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b,
                                otypes=[object])(a) if a.size else a.astype(object)
        return as_declared(a, t)


def _to_tensor(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_to_tensor(v) for v in value]
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    return tensor(np.asarray(value))


def _shape_inputs(program: Program) -> set[str]:
    """Names read at shape-deciding input positions anywhere in the program and its subgraphs."""
    names: set[str] = set()
    for node, _ in program.steps:
        for pos in SHAPE_INPUTS.get(node.op_type, ()):
            if pos < len(node.inputs) and node.inputs[pos]:
                names.add(node.inputs[pos])
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Program):
                    names |= _shape_inputs(sub)
    return names


class TensorFlowBackend(Backend):
    name = "tensorflow"
    about = FRAMEWORK.about
    modes = FRAMEWORK.modes

    @classmethod
    def traces_step(cls) -> bool:
        return True  # every mode: the step is a tf.function (XLA-compiled in tensorflow:xla)

    @classmethod
    def precisions(cls, device: str = "CPU") -> tuple[str, ...]:
        """bf16 (mixed_bfloat16's rule on the translated graph: linear ops in bf16, variables
        float32); fp16's loss scaling is built on torch only."""
        return ("fp32", "bf16")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            return bool(tf.config.list_physical_devices("GPU"))
        return super().supports_device(device)

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return TensorFlowExecutable(model, device, xla=cls.mode == "xla")
