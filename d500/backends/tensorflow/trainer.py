"""The TensorFlow Trainer: forward, GradientTape backward and the optimizer update traced into one
tf.function over the module's tf.Variables; only the batch and the loss cross to NumPy.

The learning rate goes in as a float32 scalar tensor, so a new value never retraces. Each
function traces once for the first batch shape (static shapes: the fastest graph) and once more
for all other batch sizes (input signature, batch dimension None): a last short batch traces
once, not every epoch (`Traced`). Convolutions run channels-last inside the graph
(core.ChannelsLast); the parameters stay tf.Variables in ONNX's layout, so the optimizer updates
them as they are, and outputs leave through `plain`. `step` and `gradients` run the model's
training form and assign BatchNormalization's updated running statistics to their (non-trainable)
variables inside the same function; `predict` runs the model as written.

bf16 (d500.training.precision) is Keras' mixed_bfloat16 policy applied to the translated graph:
the linear operators (precision.LINEAR_OPS) compute in bfloat16 on their float32 inputs cast
down, their outputs cast back up; the variables, the gradients and the optimizer stay float32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from d500.backends.graph import Program
from d500.backends.tensorflow.core import ChannelsLast, plain
from d500.backends.tensorflow.executable import translate
from d500.backends.trainer_base import Trainer
from d500.errors import UnsupportedOperator, UsageError
from d500.training.precision import LINEAR_OPS

_LOW = {"bf16": tf.bfloat16}  # precision -> the dtype the linear operators compute in


def _cast(x: Any, source: tf.DType, target: tf.DType) -> Any:
    """`x` cast from `source` to `target` when it is a tensor (or a channels-last one) of
    `source`; anything else as it is."""
    if isinstance(x, ChannelsLast):
        return ChannelsLast(_cast(x.t, source, target))
    if isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype == source:
        return tf.cast(x, target)
    return x


def lowered(fn: Callable[..., Any], dtype: tf.DType) -> Callable[..., Any]:
    """An operator that computes in `dtype` on float32 inputs and gives float32 outputs."""
    def run(node: Any, *inputs: Any) -> Any:
        out = fn(node, *[_cast(x, tf.float32, dtype) for x in inputs])
        if isinstance(out, tuple):
            return tuple(_cast(o, dtype, tf.float32) for o in out)
        return _cast(out, dtype, tf.float32)
    return run


class Traced:
    """A function of (feeds, *scalars) traced at most twice, called as concrete functions (which
    skips tf.function's per-call argument matching, ~0.3 ms): once for the first batch shape, with
    static shapes, and once for every other batch size, by the input signature (symbolic
    dimensions None). A graph that cannot be traced with unknown sizes gets one trace per shape."""

    def __init__(self, fn: Callable[..., Any], feeds: dict[str, tf.TensorSpec],
                 scalars: list[tf.TensorSpec], **jit: Any):
        self.function = tf.function(fn, autograph=False, **jit)  # jit: the mode's XLA flag
        self.signature = [feeds, *scalars]
        self.concrete: dict[tuple, Any] = {}
        self.general: Any = None

    def __call__(self, feeds: dict[str, tf.Tensor], *scalars: tf.Tensor) -> Any:
        key = tuple((n, tuple(t.shape), t.dtype) for n, t in feeds.items())
        found = self.concrete.get(key)
        if found is None:
            found = self.concrete[key] = self._trace(feeds, scalars)
        return found(feeds, *scalars)

    def _trace(self, feeds: dict[str, tf.Tensor], scalars: tuple) -> Any:
        if not self.concrete:  # the first shape: the batch size training runs at
            return self.function.get_concrete_function(feeds, *scalars)
        if self.general is None:
            try:
                self.general = self.function.get_concrete_function(*self.signature)
            except UnsupportedOperator as err:
                if "must be known when the graph is traced" not in str(err):
                    raise
                self.general = False
        if self.general is False:
            return self.function.get_concrete_function(feeds, *scalars)
        return self.general


class TensorFlowTrainer(Trainer):
    """One tf.function per job: `step` (forward of the loss, tape gradient, d500 optimizer or its
    Keras twin, all in one graph) and one `predict` function per output."""

    def __init__(self, executable: Any, optimizer: Any, loss: str = "loss", native: bool = False,
                 *, program: Program, constants: Mapping[str, np.ndarray], device: str,
                 baked: set[str], to_numpy: Callable[[str, Any], Any],
                 jit: Mapping[str, Any] | None = None, precision: str = "fp32"):
        super().__init__(executable, optimizer, loss, native)
        self.jit = dict(jit or {})  # {"jit_compile": True} in the mode tensorflow:xla
        self.program, self.constants, self.device = program, dict(constants), device
        self.to_numpy = to_numpy  # (output name, tensor) -> NumPy, as Executable.run converts
        self.variables = executable.native.params  # name -> tf.Variable (the module's own)
        self.names = list(self.parameter_names)
        self.vars = [self.variables[n] for n in self.names]
        self.trained = dict(zip(self.names, self.vars))  # what the optimizer updates
        self.nodes = [(n.inputs, n.outputs, n.proto) for n, _ in program.steps]
        self.train_program = (translate(self.training.model) if self.training.updates
                              else program)
        train = self.train_program
        keep, self.train_inputs = self.needed_inputs(
            [(n.inputs, n.outputs, n.proto) for n, _ in train.steps], [loss])
        shaped = sorted(set(self.train_inputs) & baked)
        if shaped:
            raise UsageError(f"input '{shaped[0]}' decides a shape in the graph: the "
                             f"TensorFlow trainer needs every input as a tensor of data")
        self.precision = precision
        low = _LOW.get(precision)
        self.train_steps = [(node, lowered(fn, low) if low is not None and node.op_type in
                             LINEAR_OPS else fn) for node, fn in (train.steps[i] for i in keep)]
        made = {o for node, _ in self.train_steps for o in node.outputs}
        updates = [s for s, out in self.training.updates.items() if out in made]
        self.train_outputs = [loss, *(self.training.updates[s] for s in updates)]
        self.updated = [self.variables[s] for s in updates]  # assigned the outputs after loss
        if self.native:
            self.keras_optimizer = self.native_twin("tensorflow", self.vars)
        else:
            self.state = optimizer.init(self.trained, "tensorflow")  # tf.Variables, made now
        self.traces = 0  # how many times the step function was traced
        self.lr: tuple[float, Any] = (float("nan"), None)
        self.step_function = Traced(self._step, self._specs(self.train_inputs),
                                    [tf.TensorSpec([], tf.float32, name="lr")], **self.jit)
        self.predictors: dict[str, tuple[Any, list[str]]] = {}
        self.gradient_function: Traced | None = None  # gradients() and apply(), made on first use
        self.apply_function: Traced | None = None

    def _specs(self, names: list[str]) -> dict[str, tf.TensorSpec]:
        return {n: tf.TensorSpec(self.input_shapes.get(n), tf.as_dtype(self.input_dtypes[n]),
                                 name=n) for n in names}

    def _forward(self, program: Program, steps: list, feeds: Mapping[str, tf.Tensor],
                 outputs: list[str]) -> list[tf.Tensor]:
        """The `steps` of `program` traced on `feeds` (inside a tf.function); `outputs` in
        ONNX's layout."""
        read = {n for node, _ in steps for n in node.inputs}
        env: dict[str, Any] = {k: tf.constant(v) for k, v in self.constants.items() if k in read}
        env.update(self.variables)
        env.update(feeds)
        saved, program.scope = program.scope, env  # subgraphs look outer names up here
        try:
            for node, fn in steps:
                out = fn(node, *[env[n] if n else None for n in node.inputs])
                if not isinstance(out, tuple):
                    out = (out,)
                for name, value in zip(node.outputs, out):
                    if name:
                        env[name] = value
            return [plain(env[name]) for name in outputs]
        finally:
            program.scope = saved

    def _train_forward(self, feeds: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """The loss of the training form and the updated running statistics (not assigned)."""
        loss, *stats = self._forward(self.train_program, self.train_steps, feeds,
                                     self.train_outputs)
        return loss, stats

    def _update(self, stats: list[tf.Tensor]) -> None:
        for var, value in zip(self.updated, stats):
            var.assign(tf.cast(value, var.dtype))

    def _step(self, feeds: dict[str, tf.Tensor], lr: tf.Tensor) -> tf.Tensor:
        self.traces += 1
        loss, grads = self._gradients(feeds)
        self._apply(dict(zip(self.names, grads)), lr)
        return loss

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        batch = {n: tf.constant(a) for n, a in self.batch(feeds, self.train_inputs).items()}
        if lr != self.lr[0]:  # a schedule's value: the tensor made once per distinct value
            self.lr = (lr, tf.constant(lr, tf.float32))
        return float(self.step_function(batch, self.lr[1]))

    # -- the step's two halves, each also traced alone for the distributed schemes ----------
    def _gradients(self, feeds: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.device(self.device):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(self.vars)
                loss, stats = self._train_forward(feeds)
            grads = tape.gradient(loss, self.vars)
            self._update(stats)
            return tf.identity(loss), [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                                       for v, g in zip(self.vars, grads)]

    def _apply(self, grads: dict[str, tf.Tensor], lr: tf.Tensor) -> tf.Tensor:
        with tf.device(self.device):
            ordered = [grads[n] for n in self.names]
            if self.native:
                self.keras_optimizer.learning_rate.assign(lr)
                self.keras_optimizer.apply_gradients(zip(ordered, self.vars))
            else:
                self.optimizer.step(self.trained, dict(zip(self.names, ordered)), self.state,
                                    lr)
            return tf.constant(0)

    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the gradients from one traced tf.function, as new writable NumPy
        arrays (the same forward and tape as `step`, without the update)."""
        if self.gradient_function is None:
            self.gradient_function = Traced(self._gradients, self._specs(self.train_inputs), [],
                                            **self.jit)
        batch = {n: tf.constant(a) for n, a in self.batch(feeds, self.train_inputs).items()}
        loss, grads = self.gradient_function(batch)
        return float(loss), {n: np.array(g) for n, g in zip(self.names, grads)}

    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The optimizer update in one traced tf.function taking the gradient tensors."""
        self.check_gradients(grads)
        if self.apply_function is None:
            specs = {n: tf.TensorSpec(v.shape, v.dtype) for n, v in zip(self.names, self.vars)}
            self.apply_function = Traced(self._apply, specs,
                                         [tf.TensorSpec([], tf.float32, name="lr")], **self.jit)
        tensors = {n: tf.constant(np.asarray(grads[n], dtype=v.dtype.as_numpy_dtype))
                   for n, v in zip(self.names, self.vars)}
        if lr != self.lr[0]:
            self.lr = (lr, tf.constant(lr, tf.float32))
        self.apply_function(tensors, self.lr[1])

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        found = self.predictors.get(output)
        if found is None:
            keep, inputs = self.needed_inputs(self.nodes, [output])
            steps = [self.program.steps[i] for i in keep]

            def forward(feeds: dict[str, tf.Tensor]) -> tf.Tensor:
                with tf.device(self.device):
                    return self._forward(self.program, steps, feeds, [output])[0]

            found = self.predictors[output] = (
                Traced(forward, self._specs(inputs), [], **self.jit), inputs)
        function, inputs = found
        batch = {n: tf.constant(a) for n, a in self.batch(feeds, inputs).items()}
        return self.to_numpy(output, function(batch))
