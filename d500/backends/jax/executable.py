"""JaxExecutable: an ONNX graph jitted whole (`jax.jit`) over its parameters and inputs (in the
mode jax:eager, the same function run op by op, unjitted).

Float initializers are the parameters, arguments of the jitted function (setting them never
retraces); other initializers are constants of the trace. Graph inputs whose *values* decide
shapes (a Reshape target, Slice starts, Pad pads, axes, a Loop trip count, strings, ...) are
baked into the trace as constants, one jitted function per distinct value, so every shape is
static while tracing: which inputs those are is learnt from the first trace that needs one.

64-bit types: ONNX has float64, int64 and uint64 tensors, which JAX computes only with
`jax_enable_x64`. The backend enables it for its own work only (`jax.enable_x64(True)` around
preparing, tracing and running), so JAX code elsewhere in the process keeps JAX's 32-bit
defaults; inside, every value carries its ONNX dtype explicitly, so float32 stays float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper

from d500.backends.base import Backend, Executable, as_declared, output_to_numpy, to_numpy
from d500.backends.graph import Program
from d500.backends.jax.core import is_tracer
from d500.backends.jax.framework import FRAMEWORK
from d500.backends.jax.ops import OPS, NeedsStatic
from d500.backends.layout import plain
from d500.errors import D500Error, UsageError

# When a trace needs a value that no node names as a graph input (it reaches a shape through
# other operators), integer inputs up to _BAKE_LIMIT elements and others up to _BAKE_SMALL are
# baked.
_BAKE_LIMIT, _BAKE_SMALL = 4096, 16
# Float values computed from constants alone above this many elements are arguments of the
# jitted function rather than constants of its trace.
_FOLD_ARGUMENT = 1024


def x64():
    """The context the backend computes in: JAX's 64-bit types on (see the module docstring)."""
    return jax.enable_x64(True)


def translate(model: onnx.ModelProto) -> Program:
    """The model's graph as a Program on the JAX op table."""
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version
              for o in model.opset_import}
    functions = {(f.domain, f.name): f for f in model.functions}
    return Program(model.graph, opsets, OPS, "jax", functions=functions)


def _is_string(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


def _traceable(x: Any) -> bool:
    """Whether a value can cross the jit boundary (strings cannot: they are baked)."""
    if isinstance(x, list):
        return all(_traceable(v) for v in x)
    return not _is_string(x)


def _small(value: Any) -> bool:
    """A feed worth baking when a trace needs a value no graph input names directly."""
    if value is None or isinstance(value, list) or is_tracer(value):
        return False
    a = np.asarray(value)
    floating = a.dtype.kind in "fb" or a.dtype.kind == "V" and a.dtype.itemsize <= 2  # bfloat16
    return (a.dtype.kind in "iu" and a.size <= _BAKE_LIMIT
            or floating and a.size <= _BAKE_SMALL)


class JaxExecutable(Executable):
    backend_name = "jax"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", jit: bool = True):
        super().__init__(model, device)
        self.jit = jit  # False in the mode jax:eager: every op runs as it is called
        self._device = jax.devices("gpu" if device.upper().startswith("CUDA") else "cpu")[0]
        with x64():
            self.program = translate(model)
            arrays = {t.name: to_numpy(t) for t in model.graph.initializer}
            wanted = set(self.parameter_names)
            self._constants = {k: v for k, v in arrays.items() if k not in wanted}
            self._params = {k: jax.device_put(arrays[k], self._device)
                            for k in self.parameter_names}
            self._folded, self._large = self._fold()
        self._bake: set[str] = set()
        self._output_types = {o.name: o.type for o in model.graph.output}
        self._input_dtypes = {
            i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            for i in model.graph.input if i.type.HasField("tensor_type")
            and i.type.tensor_type.elem_type}
        self._functions: dict[tuple, Any] = {}  # baked key -> (jitted function, static outs)

    # -- tracing --------------------------------------------------------------------------
    def _split(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], tuple]:
        """Feeds for the jitted function, and the baked inputs as a hashable key."""
        dynamic, baked = {}, []
        for name, value in feeds.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "V":
                value = value.view(self._input_dtypes[name])  # raw 16-bit words: bfloat16
            if value is not None and not isinstance(value, list) and not is_tracer(value) and (
                    name in self._bake or _is_string(np.asarray(value))):
                a = np.asarray(value)
                raw = tuple(a.ravel().tolist()) if a.dtype.kind in "OUS" else a.tobytes()
                baked.append((name, a.dtype, a.shape, raw))
            else:
                dynamic[name] = value
        return dynamic, tuple(sorted(baked, key=lambda b: b[0]))

    def _baked_values(self, baked: tuple) -> dict[str, Any]:
        env = {}
        for name, dtype, shape, raw in baked:
            if isinstance(raw, tuple):
                env[name] = np.array(raw, dtype=object).reshape(shape)
            else:
                env[name] = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        return env

    def _function(self, baked: tuple, grad: tuple | None = None):
        """The jitted function for the baked inputs `baked`: the outputs; with `grad` (the
        differentiated output's index or None, the output gradients' indices, the names
        differentiated), (the outputs, the gradients of the objective `gradients` documents)."""
        entry = self._functions.get((baked, grad))
        if entry is None:
            fixed = {**self._constants, **self._baked_values(baked)}
            static_outs: dict[int, Any] = {}

            def forward(params, large, feeds):
                env = {**fixed, **self._folded, **params, **large, **feeds}
                outs = self._run_program(env)
                result = []
                for i, value in enumerate(outs):
                    if _traceable(value):
                        result.append(value)
                    else:
                        static_outs[i] = value
                        result.append(None)
                return result

            def differentiated(params, large, feeds, g_out):
                index, given, wrt = grad

                def objective(targets):
                    outs = forward({**params, **targets}, large, {**feeds, **targets})
                    if given:
                        total = sum(jnp.sum(outs[i] * g) for i, g in zip(given, g_out))
                    else:
                        total = jnp.sum(outs[index])
                    return total, outs

                targets = {n: params[n] if n in params else feeds[n] for n in wrt}
                grads, outs = jax.grad(objective, has_aux=True)(targets)
                return outs, grads

            call = forward if grad is None else differentiated
            entry = self._functions[baked, grad] = (self.compile(call), static_outs)
        return entry

    def compile(self, fn: Any) -> Any:
        """`fn` jitted (jax.jit) in the mode jax, as it is in jax:eager (its ops run one by one,
        each dispatched by JAX as it is called)."""
        return jax.jit(fn) if self.jit else fn

    def _fold(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The values computed from constants alone (Constant, ConstantOfShape weights, ...),
        computed once here: (small ones, which stay known while tracing; large float ones,
        arguments of the jitted function, so that XLA neither embeds nor folds them)."""
        known: dict[str, Any] = dict(self._constants)
        small, large = {}, {}
        saved, self.program.scope = self.program.scope, known
        try:
            for node, fn in self.program.steps:
                if any(isinstance(v, Program) or isinstance(v, list) and v and isinstance(
                        v[0], Program) for v in node.attrs.values()):
                    continue
                if not all(n in known for n in node.inputs if n):
                    continue
                try:
                    out = fn(node, *[known[n] if n else None for n in node.inputs])
                except Exception:  # noqa: BLE001 - left to the trace, which reports it
                    continue
                out = plain(out) if isinstance(out, tuple) else (plain(out),)
                for name, value in zip(node.outputs, out):
                    if not name:
                        continue
                    known[name] = value
                    if isinstance(value, jax.Array) and value.size > _FOLD_ARGUMENT and (
                            jax.numpy.issubdtype(value.dtype, jax.numpy.inexact)):
                        large[name] = value
                    else:
                        small[name] = value
        finally:
            self.program.scope = saved
        return small, large

    def _run_program(self, env: dict[str, Any]) -> list[Any]:
        """The program's steps on `env`, those whose outputs were folded skipped."""
        program = self.program
        done = set(self._folded) | set(self._large)
        saved, program.scope = program.scope, env
        try:
            for node, fn in program.steps:
                if node.outputs and all(not n or n in done for n in node.outputs):
                    continue
                out = fn(node, *[env[n] if n else None for n in node.inputs])
                out = out if isinstance(out, tuple) else (out,)
                for name, value in zip(node.outputs, out):
                    if name:
                        env[name] = value
            return [plain(env[name]) for name in program.output_names]
        finally:
            program.scope = saved

    def _call(self, feeds: Mapping[str, Any], grad: tuple | None = None,
              g_out: Sequence[Any] = ()) -> Any:
        """The outputs for `feeds` (with `grad`, see `_function`: the outputs and gradients),
        baking the inputs a trace finds it needs as values and tracing again."""
        while True:
            dynamic, baked = self._split(feeds)
            fn, static_outs = self._function(baked, grad)
            try:
                with x64():
                    args = (self._params, self._large, dynamic)
                    outs = fn(*args) if grad is None else fn(*args, list(g_out))
            except NeedsStatic as err:
                self._functions.pop((baked, grad), None)
                new = {n for n in err.names if n in feeds} - self._bake
                if not new:
                    new = {n for n, v in feeds.items() if _small(v)} - self._bake
                if not new:
                    raise err.error from None
                self._bake |= new
                continue
            if grad is not None:
                outs, grads = outs
                return [static_outs.get(i, o) for i, o in enumerate(outs)], grads
            return [static_outs.get(i, o) for i, o in enumerate(outs)]

    # -- the contract ---------------------------------------------------------------------
    def run(self, inputs: Any, **kwargs: Any) -> list[Any]:
        try:
            outs = self._call(self.bind(inputs))
        except D500Error:
            raise
        except (TypeError, ValueError, IndexError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UsageError(f"backend 'jax': the graph failed: {first}") from err
        with x64():
            return [self._to_numpy(name, o) for name, o in zip(self.output_names, outs)]

    def parameters(self) -> dict[str, np.ndarray]:
        with x64():
            return {k: np.asarray(v) for k, v in self._params.items()}

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        with x64():
            for name, value in values.items():
                current = self._params.get(name)
                new = self.parameter_value(name, value, current)
                self._params[name] = jax.device_put(new.astype(current.dtype), self._device)

    def gradients(self, inputs: Any, *, output: str | None = None,
                  grad_outputs: Mapping[str, np.ndarray] | None = None,
                  wrt: Sequence[str] | None = None,
                  ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        feeds = self.bind(inputs)
        named = output or self.output_names[0]
        for name in grad_outputs or [named]:
            self.output_index(name)
        wrt = self.gradient_targets(feeds, wrt)
        baked = [n for n in wrt if n in self._bake]
        if baked:
            raise UsageError(f"cannot differentiate with respect to '{baked[0]}': it decides a "
                             f"shape")
        given = sorted(grad_outputs or {})
        grad = (None if given else self.output_index(named),
                tuple(self.output_index(n) for n in given), tuple(wrt))
        g_out = [np.asarray(grad_outputs[n]) for n in given]
        outs, grads = self._call(feeds, grad, g_out)
        with x64():
            return ([self._to_numpy(n, o) for n, o in zip(self.output_names, outs)],
                    {n: np.array(grads[n]) for n in wrt})

    @property
    def native(self) -> dict[str, Any]:
        """The parameters as JAX arrays by name (the pytree a JAX trainer differentiates)."""
        return self._params

    @property
    def constants(self) -> dict[str, np.ndarray]:
        """The initializers that are not parameters (integer tensors, ...) by name."""
        return self._constants

    def pure(self) -> tuple[Any, dict[str, Any]]:
        """(f, parameters): f(parameters, feeds) -> the outputs, the graph as a pure JAX function
        for a caller's jax.jit or jax.grad (it computes with 64-bit types on, as `run` does),
        and the parameters as they are now. Inputs that decide shapes must be given as NumPy."""
        def f(params: dict[str, Any], feeds: dict[str, Any]) -> list[Any]:
            with x64():
                env = {**self._constants, **self._folded, **self._large, **params, **feeds}
                return self._run_program(env)
        return f, dict(self._params)

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Any:
        from d500.backends.jax.trainer import JaxTrainer
        self.check_precision(precision)
        return JaxTrainer(self, optimizer, loss, native)

    def output_array(self, name: str, value: Any) -> Any:
        """Output `name`'s JAX value as NumPy, in the output's declared dtype (as `run` gives)."""
        with x64():
            return self._to_numpy(name, value)

    # -- outputs ------------------------------------------------------------------------------
    def _to_numpy(self, name: str, value: Any) -> Any:
        return output_to_numpy(self._output_types.get(name), value, self._convert)

    @staticmethod
    def _convert(value: Any, t: onnx.TypeProto | None) -> np.ndarray:
        a = np.asarray(value)
        if a.dtype.kind in "SU":
            return a.astype(object)
        return as_declared(a, t)


class JaxBackend(Backend):
    name = "jax"
    about = FRAMEWORK.about
    modes = FRAMEWORK.modes

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            try:
                return bool(jax.devices("gpu"))
            except RuntimeError:
                return False
        return super().supports_device(device)

    @classmethod
    def traces_step(cls) -> bool:
        return cls.mode != "eager"  # jax: one jitted step

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return JaxExecutable(model, device, jit=cls.mode != "eager")

