"""torch:compiled's training step: the loss's forward and backward traced once into one static fx
program and compiled by torch.compile; d500's optimizer then updates the parameters.

`make_fx` runs the training form's walk and `torch.autograd.grad` on real tensors with autograd
on, so the program is the joint graph: parameters, running statistics and the batch in; the loss,
every parameter's gradient and the new running statistics out. It has no walker, no Python
branches and no guards: `torch.compile(fullgraph, static shapes)` compiles it once per batch
shape (unfrozen: the parameters are its inputs and change every step). Batch normalisation stays
aten's own kernels (native_batch_norm and its backward, as eager calls them): Inductor's
decomposition of them into generated reductions ran the ResNet-20 step slower than eager and took
minutes more to compile (`_keep_batch_norm`). The update is the d500
optimizer's foreach kernels (or torch.optim's, `native`) on the parameters in place, outside the
program: its step count and learning rate are Python numbers that a trace would burn in.
A model whose trace reads the values of an input (the batch) is refused: its program would be
rebuilt every step. `compile_record()` says what compiling cost and whether the cache was warm.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from d500.backends.torch import compile_cache
from d500.backends.torch.compiled import inductor_cache, key, static_program
from d500.backends.torch.trainer import TorchTrainer
from d500.errors import UsageError

SETTINGS = {"compiler": "torch.compile", "backend": "inductor", "fullgraph": True,
            "dynamic": False, "freezing": False, "program": "forward+backward",
            "batch_norm": "aten kernels", "layout_optimization": False}


def _keep_batch_norm(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor (torch.compile's backend) without its batch-norm decompositions: the program's
    native_batch_norm and native_batch_norm_backward run as aten's kernels, and Inductor fuses
    the element-wise ops around them. Its channels-last layout optimisation is off: aten's
    batch-norm backward returns another layout than Inductor's shape function says for it, a
    stride assertion fails at run time (ResNet-20). The kept ops are registered as fallbacks
    here, not left to Inductor's implicit fallback, which refuses an op that has a
    decomposition whenever the environment sets CI."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings, make_fallback, require_contiguous
    table = {}
    for op, fn in select_decomp_table().items():
        if "batch_norm" not in str(op):
            table[op] = fn
        elif op not in lowerings:
            make_fallback(op, layout_constraint=require_contiguous, warn=False,
                          override_decomp=True)
    return compile_fx(gm, example_inputs, decompositions=table,
                      config_patches={"layout_optimization": False})


class CompiledTrainer(TorchTrainer):
    """A TorchTrainer whose loss and gradients come from the compiled joint program."""

    def __init__(self, executable: Any, optimizer: Any, loss: str = "loss",
                 native: bool = False):
        super().__init__(executable, optimizer, loss, native)
        self.stats = list(self.train_module.updates)  # running statistics the step rewrites
        self.programs: dict[tuple, tuple[Any, list[str]]] = {}
        self.compiles: list[dict[str, Any]] = []  # per program: seconds, key, cache

    def compile_record(self) -> dict[str, Any] | None:
        """What compiling cost so far: `compile_time` (seconds, trace + torch.compile + the
        first call, every program), `cache` ('warm' when any program was found compiled
        before in the cache under $D500_HOME, else 'cold') and the program keys; None before
        the first step."""
        if not self.compiles:
            return None
        return {"compile_time": sum(c["seconds"] for c in self.compiles),
                "cache": "warm" if any(c["warm"] for c in self.compiles) else "cold",
                "keys": [c["key"] for c in self.compiles]}

    def _joint(self, **feeds: Any) -> tuple[torch.Tensor, ...]:
        """The loss, the gradients and the new running statistics (what the program computes)."""
        params = [feeds[n] for n in self.names]
        env = dict(self.values)
        env.update(feeds)
        outs = self.train_plan.run(env)
        grads = torch.autograd.grad(outs[0], params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        return (outs[0], *grads, *outs[1:])

    def _loss_and_grads(self, batch: Mapping[str, np.ndarray]
                        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        env = self._env(batch, self.train_inputs)
        feeds = {n: self.values[n] for n in (*self.names, *self.stats)}
        feeds.update((n, env[n]) for n in self.train_inputs)
        shapes = key(feeds, ())
        with torch.no_grad():
            found = self.programs.get(shapes)
            outs = (self._build(feeds, shapes) if found is None
                    else found[0](*[feeds[n] for n in found[1]]))
            count = len(self.names)
            for name, new in zip(self.stats, outs[1 + count:]):
                self.values[name].copy_(new)
        return outs[0], list(outs[1:1 + count])

    def _build(self, feeds: dict[str, Any], shapes: tuple) -> Any:
        """Trace and compile the program for `feeds`' shapes; returns its first call's outputs
        (the compile happens in that call)."""
        folder = inductor_cache()
        shape = "x".join(map(str, feeds[self.train_inputs[0]].shape)) if self.train_inputs else ""
        sys.stderr.write(f"d500: torch:compiled compiles its training step for batches of "
                         f"{shape} (up to minutes with a cold cache; the cache: {folder})\n")
        sys.stderr.flush()
        t0 = time.perf_counter()
        gm, baked = static_program(self._joint, feeds, "the training step", grad=True)
        if baked:
            raise UsageError(f"backend 'torch:compiled': the training step reads the values of "
                             f"{', '.join(map(repr, baked))}, so its program would be rebuilt "
                             f"for every batch; train this model on the backend 'torch'")
        program = compile_cache.program_key(gm, SETTINGS)
        warm = compile_cache.seen(program)
        free = list(feeds)
        fn = torch.compile(gm, backend=_keep_batch_norm, fullgraph=True, dynamic=False)
        with torch.no_grad():
            outs = fn(*[feeds[n] for n in free])
        compile_cache.mark(program)
        self.compiles.append({"seconds": time.perf_counter() - t0, "key": program,
                              "warm": warm})
        self.programs[shapes] = (fn, free)
        return outs

    def step(self, feeds: Mapping[str, np.ndarray], lr: float) -> float:
        loss, grads = self._loss_and_grads(feeds)
        self.update(grads, lr)
        return loss.item()

    def gradients(self, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The compiled loss and gradients; each gradient becomes `param.grad` and is returned
        as a NumPy view of it (CPU; a copy from another device), as TorchTrainer's."""
        loss, grads = self._loss_and_grads(feeds)
        views: dict[str, np.ndarray] = {}
        for name, p, g in zip(self.names, self.params, grads):
            g = g.contiguous()
            p.grad = g
            views[name] = g.numpy() if g.device.type == "cpu" else g.cpu().numpy()
        self._grad_views = views
        return loss.item(), views
