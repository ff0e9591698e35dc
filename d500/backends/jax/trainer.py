"""The JAX Trainer: the translated graph's loss, `jax.value_and_grad` of it and the optimizer update
(d500's framework-neutral one through the JAX ops namespace, or its optax twin) in one jitted
step; only the batch goes in and the loss comes out.

JAX arrays are immutable: the step is a pure function (parameters, running statistics, optimizer
state, batch, learning rate) -> (loss, new parameters, new statistics, new state), and the
trainer keeps what it returns: the parameters and running statistics in the executable's own
dict (`JaxExecutable.native`), so `run`, `parameters` and `predict` see every update. jax.jit
traces once per batch shape (a last short batch once more) and never for a new learning rate
(a float32 argument); in the mode jax:eager nothing is jitted (each op runs as it is called).
Like the executable, the trainer computes with JAX's 64-bit types on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from d500.backends.graph import Program
from d500.backends.jax.executable import translate, x64
from d500.backends.jax.ops import NeedsStatic
from d500.backends.layout import plain
from d500.backends.trainer_base import Trainer
from d500.errors import UsageError
from d500.training.optimizers import ops as ops_registry


def run_steps(program: Program, steps: list, env: dict[str, Any],
              outputs: list[str]) -> list[Any]:
    """The `steps` of `program` on `env` (the model's values and the batch, by name); `outputs`."""
    saved, program.scope = program.scope, env  # subgraphs look outer names up here
    try:
        for node, fn in steps:
            out = fn(node, *[env[n] if n else None for n in node.inputs])
            out = out if isinstance(out, tuple) else (out,)
            for name, value in zip(node.outputs, out):
                if name:
                    env[name] = value
        return [plain(env[name]) for name in outputs]  # ONNX's layout (core.ChannelsLast)
    finally:
        program.scope = saved


class Slots:
    """The optimizer's state slots split for jit: the JAX arrays (arguments of the step) and the
    rest (Python numbers, flags: constants of the trace), put back together inside it."""

    def __init__(self, slots: dict[str, Any]):
        leaves, self.tree = jax.tree_util.tree_flatten(slots)
        self.dynamic = [i for i, v in enumerate(leaves) if isinstance(v, jax.Array)]
        self.static = {i: v for i, v in enumerate(leaves) if not isinstance(v, jax.Array)}
        self.arrays = [leaves[i] for i in self.dynamic]

    def build(self, arrays: list[Any]) -> dict[str, Any]:
        leaves = dict(self.static)
        leaves.update(zip(self.dynamic, arrays))
        return jax.tree_util.tree_unflatten(self.tree, [leaves[i] for i in range(len(leaves))])

    def arrays_of(self, slots: dict[str, Any]) -> list[Any]:
        leaves = jax.tree_util.tree_leaves(slots)
        return [leaves[i] for i in self.dynamic]


class JaxTrainer(Trainer):
    """One jitted step (forward of the loss, jax.value_and_grad, the update); one jitted predict
    per output; `gradients` and `apply` jitted apart for the distributed schemes."""

    def __init__(self, executable: Any, optimizer: Any, loss: str = "loss",
                 native: bool = False):
        super().__init__(executable, optimizer, loss, native)
        self.values = executable.native  # name -> JAX array: the executable's own dict
        self.constants = executable.constants
        self.names = list(self.parameter_names)
        self.program = executable.program  # the model as written: predictions
        self.nodes = [(n.inputs, n.outputs, n.proto) for n, _ in self.program.steps]
        with x64():
            train = (translate(self.training.model) if self.training.updates
                     else self.program)
        self.train_program = train
        keep, self.train_inputs = self.needed_inputs(
            [(n.inputs, n.outputs, n.proto) for n, _ in train.steps], [loss])
        self.train_steps = [train.steps[i] for i in keep]
        made = {o for node, _ in self.train_steps for o in node.outputs}
        self.updates = [s for s, out in self.training.updates.items() if out in made]
        self.train_outputs = [loss, *(self.training.updates[s] for s in self.updates)]
        self.ops = ops_registry.get("jax")
        with x64():
            params = [self.values[n] for n in self.names]
            if self.native:
                self.transform = self.native_twin("jax", params)
                self.opt_state = self.transform.init(dict(zip(self.names, params)))
            else:
                self.slots = Slots(optimizer.init_state(self.ops, params, self.names))
                self.opt_state = (self.slots.arrays, self.ops.counter().n)
        self.traces = 0  # how many times the step function was traced (eager: called)
        jit = executable.compile  # jax.jit; in jax:eager, the functions as they are
        self.step_function = jit(self._step)
        self.gradient_function = jit(self._gradients)
        self.apply_function = jit(self._apply)
        self.predictors: dict[str, tuple[Any, list[str]]] = {}

    # -- the pure functions jitted --------------------------------------------------------------
    def _loss(self, trained: dict[str, Any], frozen: dict[str, Any],
              feeds: dict[str, Any]) -> tuple[Any, list[Any]]:
        env = {**self.constants, **frozen, **trained, **feeds}
        loss, *stats = run_steps(self.train_program, self.train_steps, env, self.train_outputs)
        return jnp.sum(loss), stats  # a scalar loss (a one-element loss sums to itself)

    def _grads(self, trained, frozen, feeds):
        return jax.value_and_grad(self._loss, has_aux=True)(trained, frozen, feeds)

    def _update(self, trained: dict[str, Any], grads: dict[str, Any], state: Any,
                lr: Any) -> tuple[dict[str, Any], Any]:
        if self.native:
            direction, state = self.transform.update(grads, state, trained)
            return {n: (trained[n] - lr * direction[n]).astype(trained[n].dtype)
                    for n in self.names}, state
        arrays, count = state
        slots, counter = self.slots.build(arrays), self.ops.Counter(count)
        params = [trained[n] for n in self.names]
        self.optimizer.update(self.ops, params, [grads[n] for n in self.names], slots, lr,
                              self.ops.increment(counter))
        return dict(zip(self.names, params)), (self.slots.arrays_of(slots), counter.n)

    def _step(self, trained, frozen, state, feeds, lr):
        self.traces += 1
        (loss, stats), grads = self._grads(trained, frozen, feeds)
        trained, state = self._update(trained, grads, state, lr)
        return loss, trained, stats, state

    def _gradients(self, trained, frozen, feeds):
        (loss, stats), grads = self._grads(trained, frozen, feeds)
        return loss, stats, grads

    def _apply(self, trained, grads, state, lr):
        return self._update(trained, grads, state, lr)

    # -- calls ----------------------------------------------------------------------------------
    def _split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the trained parameters, the rest of the model's values) by name."""
        trained = {n: self.values[n] for n in self.names}
        return trained, {n: v for n, v in self.values.items() if n not in trained}

    def _feeds(self, feeds: Mapping[str, np.ndarray], needed: list[str]) -> dict[str, Any]:
        return self.batch(feeds, needed)

    def _traced(self, function: Any, *args: Any) -> Any:
        try:
            with x64():
                return function(*args)
        except NeedsStatic as err:
            names = [n for n in err.names if n in self.executable.input_names]
            what = f"input '{names[0]}'" if names else "a value computed from the inputs"
            raise UsageError(f"{what} decides a shape in the graph: the JAX trainer needs every "
                             f"input as a tensor of data ({err.error})") from None

    def _keep(self, trained: dict[str, Any], stats: list[Any]) -> None:
        self.values.update(trained)
        self.values.update(zip(self.updates, stats))

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        trained, frozen = self._split()
        batch = self._feeds(feeds, self.train_inputs)
        loss, trained, stats, self.opt_state = self._traced(
            self.step_function, trained, frozen, self.opt_state, batch, np.float32(lr))
        self._keep(trained, stats)
        return float(loss)

    # -- the split for distributed schemes (step above does not use it) ---------------------
    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the gradients from one jitted function, as new writable NumPy arrays
        (the same forward and value_and_grad as `step`, without the update)."""
        trained, frozen = self._split()
        batch = self._feeds(feeds, self.train_inputs)
        loss, stats, grads = self._traced(self.gradient_function, trained, frozen, batch)
        self.values.update(zip(self.updates, stats))
        return float(loss), {n: np.array(grads[n]) for n in self.names}

    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The optimizer update in one jitted function taking the gradient arrays."""
        self.check_gradients(grads)
        trained, _ = self._split()
        given = {n: np.asarray(grads[n], dtype=trained[n].dtype) for n in self.names}
        trained, self.opt_state = self._traced(self.apply_function, trained, given,
                                               self.opt_state, np.float32(lr))
        self.values.update(trained)

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        found = self.predictors.get(output)
        if found is None:
            keep, inputs = self.needed_inputs(self.nodes, [output])
            steps = [self.program.steps[i] for i in keep]

            def forward(values: dict[str, Any], feeds: dict[str, Any]) -> Any:
                env = {**self.constants, **values, **feeds}
                return run_steps(self.program, steps, env, [output])[0]

            found = self.predictors[output] = (self.executable.compile(forward), inputs)
        function, inputs = found
        out = self._traced(function, dict(self.values), self._feeds(feeds, inputs))
        return self.executable.output_array(output, out)
