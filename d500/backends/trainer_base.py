"""The training contract: Trainer, the base class of every backend's trainer, with the checks
and input handling they share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import helper

from d500.backends.dataflow import needed_nodes
from d500.errors import UsageError

if TYPE_CHECKING:
    from d500.backends.base import Executable


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

    precision = "fp32"  # what its linear layers compute in (d500.training.precision)

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

    def compile_record(self) -> dict[str, Any] | None:
        """What compiling its step cost so far, for a compiling mode's trainer (torch:compiled:
        compile_time, cache, keys); None for one that does not compile."""
        return None

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
