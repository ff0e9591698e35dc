"""The torch Trainer: the translated graph's loss, autograd, and a d500 optimizer (or its
torch.optim twin) updating the module's parameters in place; only the batch and the loss cross
to NumPy.
The loss comes from the model's training form (`TrainStep`, the module DDP wraps too), which
overwrites BatchNormalization's running statistics, buffers of the module, in place.
Mixed precision (d500.training.precision): the training forward runs under torch.autocast in
bf16 or fp16, over the float32 parameters, so gradients and the optimizer stay float32; fp16
scales the loss (LossScale) and skips a step whose gradients are not finite."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from d500.backends.graph import Program
from d500.backends.torch.dtypes import from_numpy, to_numpy
from d500.backends.torch.executable import GraphModule, Plan, TorchExecutable, translate
from d500.backends.trainer_base import Trainer
from d500.errors import UsageError
from d500.training.precision import LossScale

# NumPy dtypes torch stores as they are: a batch of these goes in by torch.from_numpy (no copy).
_DIRECT = {np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int64, np.int32,
                                  np.int16, np.int8, np.uint8, np.bool_)}
# torch float dtype -> NumPy's: what a gradient array given to `apply` is made into
_NUMPY_DTYPES = {torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
                 torch.float64: np.dtype(np.float64)}
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # precision -> autocast's dtype


def pruned_plan(program: Program, keep: list[int], outputs: list[str]) -> Plan:
    """A Plan running only the steps `keep` of `program` and returning `outputs` (scope lookups
    of subgraphs still go through `program` itself)."""
    view = copy.copy(program)
    view.steps = [program.steps[i] for i in keep]
    view.output_names = list(outputs)
    plan = Plan(view)
    plan.program = program
    return plan


class TrainStep(torch.nn.Module):
    """A training forward as a module over the graph module's own tensors (what DDP wraps): the
    loss of `plan` (the training form, pruned to the loss), after which the running statistics
    `updates` (buffers of `graph`, in the order of the plan's outputs after the loss) are
    overwritten with their updated values."""

    def __init__(self, graph: GraphModule, plan: Plan, updates: list[str]):
        super().__init__()
        self.graph = graph
        self.plan = plan
        self.updates = updates

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        env = dict(self.graph.values)
        env.update(inputs)
        return self.run(env)

    def run(self, env: dict[str, Any]) -> torch.Tensor:
        """The loss on `env` (the module's values and the batch, by name)."""
        outs = self.plan.run(env)
        if self.updates:
            values = self.graph.values
            with torch.no_grad():
                for name, new in zip(self.updates, outs[1:]):
                    values[name].copy_(new)
        return outs[0]


def _own_precision(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` with autocast off (the training forward turns on its own): the backward and
    the update compute in float32 whatever autocast someone else switched on (an entry's file
    in the worker), so a run computes in the precision it records."""
    @functools.wraps(method)
    def run(self: TorchTrainer, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device.type, enabled=False):
            return method(self, *args, **kwargs)
    return run


class TorchTrainer(Trainer):
    """Forward of the loss, torch.autograd.grad of it, and the optimizer step under no_grad on
    the very parameter tensors of the executable's module (updated in place, never replaced)."""

    def __init__(self, executable: TorchExecutable, optimizer: Any, loss: str = "loss",
                 native: bool = False, precision: str = "fp32"):
        super().__init__(executable, optimizer, loss, native)
        module = executable.native
        self.device = executable.torch_device
        self.precision = precision
        self.scale = LossScale() if precision == "fp16" else None  # fp16: dynamic loss scale
        self.values = module.values  # name -> parameter/buffer/constant of the module
        self.names = list(self.parameter_names)
        self.params = [self.values[n] for n in self.names]
        self.named = dict(zip(self.names, self.params))
        self.program = module.program  # the model as written: predictions
        self.nodes = [(n.inputs, n.outputs, n.proto) for n, _ in self.program.steps]
        train = (translate(self.training.model, self.device) if self.training.updates
                 else self.program)
        keep, self.train_inputs = self.needed_inputs(
            [(n.inputs, n.outputs, n.proto) for n, _ in train.steps], [loss])
        made = {o for i in keep for o in train.steps[i][0].outputs}
        updates = [s for s, out in self.training.updates.items() if out in made]
        self.train_plan = pruned_plan(train, keep,
                                      [loss, *(self.training.updates[s] for s in updates)])
        self.train_module = TrainStep(module, self.train_plan, updates)
        self.predictors: dict[str, tuple[Plan, list[str], int]] = {}
        if self.native:
            self.torch_optimizer = self.native_twin("torch", self.params)
        else:
            self.state = optimizer.init(self.named, "torch")

    def _env(self, feeds: Mapping[str, Any], needed: list[str]) -> dict[str, Any]:
        env = dict(self.values)
        cpu = self.device.type == "cpu"
        for name, array in self.batch(feeds, needed).items():
            if array.dtype in _DIRECT and array.flags.writeable:
                tensor = torch.from_numpy(array)
                env[name] = tensor if cpu else tensor.to(self.device, non_blocking=True)
            else:
                env[name] = from_numpy(array, self.device)
        return env

    def autocast(self) -> Any:
        """The training forward's precision, always set: fp32 turns off an autocast that
        someone else (an entry's file) switched on, so a run computes in what it records."""
        dtype = _AUTOCAST.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16,
                              enabled=dtype is not None)

    def forward(self, env: dict[str, Any]) -> torch.Tensor:
        """The training loss on `env` at the trainer's precision, as a float32 scalar."""
        with self.autocast():
            loss = self.train_module.run(env)
        return loss.float()

    @_own_precision
    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        env = self._env(feeds, self.train_inputs)
        with torch.enable_grad():
            loss = self.forward(env)
            if self.native and self.scale is None:
                optimizer = self.torch_optimizer
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.step()
                return loss.item()
            grads, skip = self.backward(loss)
        if not skip:  # fp16: inf or nan in the gradients; the scale backed off
            self.update(grads, lr)
        return loss.item()

    def update(self, grads: list[torch.Tensor], lr: float) -> None:
        """The optimizer's step on the parameters in place from `grads` (in their order): the
        d500 optimizer's, or (native) its torch.optim twin's with the learning rate set."""
        if self.native:
            for p, g in zip(self.params, grads):
                p.grad = g
            for group in self.torch_optimizer.param_groups:
                group["lr"] = lr
            self.torch_optimizer.step()
            return
        self.optimizer.step(self.named, dict(zip(self.names, grads)), self.state, lr)

    def backward(self, loss: torch.Tensor) -> tuple[list[torch.Tensor], bool]:
        """The float32 gradients of `loss` (a zero one for a parameter it does not depend on),
        and whether the update must be skipped: in fp16 the backward runs on the loss times
        the scale, the gradients are unscaled, and inf or nan in any of them skips the step
        (torch.amp.GradScaler's rule)."""
        scale = self.scale
        grads = list(torch.autograd.grad(loss if scale is None else loss * scale.value,
                                         self.params, allow_unused=True))
        if any(g is None for g in grads):  # a parameter the loss does not depend on
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads)]
        if scale is None:
            return grads, False
        inverse = 1.0 / scale.value
        grads = [g.float() * inverse for g in grads]
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        return grads, scale.update(not finite)

    # -- the split for distributed schemes (step above does not use it) ---------------------
    @_own_precision
    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """Forward and torch.autograd.grad; each gradient becomes `param.grad` (no copy) and is
        returned as a zero-copy NumPy view of it (CPU; a copy from another device)."""
        if self.scale is not None:
            raise UsageError("fp16 trains through `step` only: a loss-scaled step that a "
                             "distributed scheme splits could not be skipped on every rank")
        env = self._env(feeds, self.train_inputs)
        with torch.enable_grad():
            loss = self.forward(env)
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        views: dict[str, np.ndarray] = {}
        for name, p, g in zip(self.names, self.params, grads):
            g = torch.zeros_like(p) if g is None else g
            if not g.is_contiguous():
                g = g.contiguous()
            p.grad = g
            views[name] = g.numpy() if g.device.type == "cpu" else g.cpu().numpy()
        self._grad_views = views
        return loss.item(), views

    @_own_precision
    def apply(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        """The update from `grads`: views from `gradients` are used as the `param.grad` they
        share memory with; other arrays are wrapped by torch.from_numpy (no copy on CPU)."""
        self.check_gradients(grads)
        mine = getattr(self, "_grad_views", {})
        tensors = []
        for name, p in zip(self.names, self.params):
            g = grads[name]
            if (g is mine.get(name) and p.grad is not None and p.device.type == "cpu"
                    and p.grad.data_ptr() == g.ctypes.data):  # still this param.grad's view
                tensors.append(p.grad)
                continue
            t = torch.from_numpy(np.ascontiguousarray(g, dtype=_NUMPY_DTYPES[p.dtype]))
            tensors.append(t if p.device.type == "cpu" else t.to(p.device))
        self.update(tensors, lr)

    def parameter_views(self) -> dict[str, np.ndarray] | None:
        """Zero-copy NumPy views of the module's parameter tensors (CPU; None on another
        device): writing into them changes the model, e.g. for model averaging."""
        if self.device.type != "cpu":
            return None
        return {n: p.detach().numpy() for n, p in zip(self.names, self.params)}

    def predict(self, feeds: Mapping[str, np.ndarray], output: str = "logits") -> np.ndarray:
        found = self.predictors.get(output)
        if found is None:
            keep, inputs = self.needed_inputs(self.nodes, [output])
            elem = self.executable.output_types[self.executable.output_index(output)]
            found = self.predictors[output] = (
                pruned_plan(self.program, keep, [output]), inputs, elem)
        plan, inputs, elem = found
        env = self._env(feeds, inputs)
        with torch.inference_mode():
            return to_numpy(plan.run(env)[0], elem)
