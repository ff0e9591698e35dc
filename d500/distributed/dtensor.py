"""The native tensor-parallel baseline: torch DTensor (`parallelize_module` with ColwiseParallel and
RowwiseParallel, gloo, CPU tensors) on the blocks d500's tensor split finds, launched as the ddp
baseline is (rank and world size from MPI, d500.distributed.ddp.init_group).

    scheme = DTensorScheme(trainer, comm, split)   # trainer: a torch Trainer of rank t's model
    scheme.start()                                 # process group, mesh, parallelize_module
    loss = scheme.step(feeds, lr)

The model runs as the torch backend translated rank t's model (`Split.rank_model`: its Reshape
targets for t's heads), but every column and row linear of a block is an `nn.Linear` holding the
whole model's weight, which `parallelize_module` shards over the tensor mesh (column: Shard(0)
of the [out, in] weight and of the bias; row: Shard(1), its output's Partial turned Replicate by
an allreduce). A column MatMul's bias Add is the Linear's bias. DTensor's hooks make every
collective: the row output's allreduce forward, and backward an allreduce of each column
linear's input gradient (one per column linear: attention's Q, K and V each allreduce theirs,
where d500's split allreduces the block input's gradient once). The entry's framework-neutral
optimizer updates the replicated weights and each rank's local shards (`to_local()`) in place.

Bytes are counted per call with the Communicator's ring formula, from the tensors each hook
reduces (forward: a row linear's output; backward: a column linear's input where it needs a
gradient); CommDebugMode counts the same calls (tests/distributed/mpi_baseline_checks.py). Their
time is inside torch's autograd, not separable. Memory (`memory()`): the replicated weights and
the local shards, which the judge checks against its own split, as for `tensor-parallel`.
Checkpoints (d500.distributed.resuming): a rank's piece is its replicated weights and local
shards with the optimizer state over them (d500.distributed.fsdp.Shards), at its tensor
coordinate (its rank).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from d500.distributed.comm import Communicator, Traffic, ring_counts
from d500.distributed.ddp import Stepped, close_group


class DTensorScheme(Stepped):
    """torch DTensor tensor parallelism as a level-3 scheme (see the module docstring)."""

    name: ClassVar[str] = "dtensor"
    # how its traffic is named in its figures, and d500 scale times it (scaling.KINDS):
    traffic_name: ClassVar[str] = "dtensor_allreduce"  # the row-parallel blocks' allreduces
    dimension: ClassVar[str] = "tensor"  # the one it splits, over the whole world
    holds_loss = True

    def __init__(self, trainer: Any, comm: Communicator, split: Any, *, reducer: Any = None,
                 bucket_bytes: int = 25 * 2**20, timeout: float = 60.0, **options: Any):
        from d500.distributed.ddp import torch_trainer
        torch_trainer("dtensor", trainer, reducer, options, own_update=True)
        # every rank trains the whole batch: the data dimension is this rank alone
        self.trainer, self.world, self.split = trainer, comm, split
        self.comm = Communicator.single()
        self.timeout = timeout
        self.linears: Any = None
        # ONNX name -> (its Linear, "weight" or "bias", whether ONNX stores it transposed)
        self.weights: dict[str, tuple[str, str, bool]] = {}
        self.state: Any = None
        self.full: dict[str, np.ndarray] = {}
        self.traffic = Traffic()  # counted per call (module docstring)
        self._steps = 0
        from d500.distributed.fsdp import Shards
        self.piece = Shards(self)  # what a checkpoint reads and writes (module docstring)

    def start(self) -> None:
        """The process group, the tensor mesh, the block linears parallelized, the trainer's
        plan rewired to call them, the optimizer's state over the local shards."""
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import parallel

        from d500.distributed.ddp import init_group
        init_group(self.world, self.timeout)
        linears, styles, calls = self._linears()
        self.linears = torch.nn.ModuleDict(linears)
        mesh = init_device_mesh("cpu", (self.world.size,))
        parallel.parallelize_module(self.linears, mesh, {
            k: parallel.ColwiseParallel() if v == "column" else parallel.RowwiseParallel()
            for k, v in styles.items()})
        self._rewire(calls, styles)
        t = self.trainer
        for name, p in zip(t.names, t.params):  # the rank model's own slices: unused now
            if name in self.weights:
                p.data = torch.empty(0, dtype=p.dtype)
        self.state = t.optimizer.init(self._local(), "torch")
        t.state = None

    def _linears(self) -> tuple[dict[str, Any], dict[str, str], dict[str, tuple]]:
        """One nn.Linear per block linear, holding the whole model's weight as [out, in];
        their styles; and per linear node (by weight name) the fused bias Add's output."""
        import torch
        from onnx import numpy_helper
        g = self.split.model_proto.graph
        inits = {t.name: t for t in g.initializer}
        readers: dict[str, list[Any]] = {}
        for n in g.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        linears, styles, calls = {}, {}, {}
        for b in self.split.blocks:
            for k in [*b.columns, b.row]:
                node = g.node[k]
                w = numpy_helper.to_array(inits[node.input[1]])
                trans = any(a.name == "transB" and a.i for a in node.attribute)
                weight = w if trans else w.T  # nn.Linear's [out, in]
                bias = bias_add = None
                if k != b.row:  # a column's bias: Gemm's third input, or the Add after it
                    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
                        bias = node.input[2]
                    else:
                        add = [r for r in readers.get(node.output[0], []) if r.op_type == "Add"
                               and any(i in self.split.axes and i != node.input[1]
                                       for i in r.input)]
                        if len(add) == 1:
                            bias_add = add[0]
                            bias = next(i for i in add[0].input if i != node.output[0])
                key = f"l{len(linears)}"
                lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
                with torch.no_grad():
                    lin.weight.copy_(torch.from_numpy(np.array(weight, copy=True)))
                    if bias is not None:
                        init = np.array(numpy_helper.to_array(inits[bias]))
                        lin.bias.copy_(torch.from_numpy(init))
                linears[key] = lin
                styles[key] = "column" if k != b.row else "row"
                self.weights[node.input[1]] = (key, "weight", not trans)
                if bias is not None:
                    self.weights[bias] = (key, "bias", False)
                calls[node.input[1]] = (key, None if bias_add is None else bias_add.output[0])
        return linears, styles, calls

    def _rewire(self, calls: dict[str, tuple], styles: dict[str, str]) -> None:
        """The trainer's training plan with each block linear (and a fused bias Add) calling
        its parallelized nn.Linear, which reads only the activation."""
        plan = self.trainer.train_plan
        fused = {out: key for key, out in calls.values() if out is not None}
        steps = []
        for node, fn, inputs, outputs, dead in plan.steps:
            if node.op_type in ("MatMul", "Gemm") and len(inputs) > 1 and inputs[1] in calls:
                key = calls[inputs[1]][0]
                fn, inputs = self._call(key, styles[key]), (inputs[0],)
            elif node.op_type == "Add" and outputs[0] in fused:  # its Linear added the bias
                fn, inputs = _passed, tuple(i for i in inputs if i not in self.weights)
            steps.append((node, fn, inputs, outputs, dead))
        plan.steps = steps

    def _call(self, key: str, style: str) -> Any:
        """`key`'s Linear as a plan step, its collective's bytes counted (module docstring)."""
        linear = self.linears[key]

        def run(node: Any, x: Any) -> Any:
            y = linear(x)
            if style == "row":
                self._count(y)
            elif x.requires_grad:  # its gradient is allreduced in the backward
                self._count(x)
            return y
        return run

    def _count(self, reduced: Any) -> None:
        """One ring allreduce of a tensor shaped as `reduced`."""
        sent, received = ring_counts(reduced.numel(), self.world.size, self.world.rank)
        self.traffic.calls += 1
        self.traffic.sent += sent * reduced.element_size()
        self.traffic.received += received * reduced.element_size()

    def _params(self) -> dict[str, Any]:
        """Every trained tensor by ONNX name: the replicated weights, the Linears' DTensors."""
        t = self.trainer
        out = {n: p for n, p in zip(t.names, t.params) if n not in self.weights}
        for name, (key, attr, _) in self.weights.items():
            out[name] = getattr(self.linears[key], attr)
        return out

    def _local(self) -> dict[str, Any]:
        return {n: p.to_local() if hasattr(p, "to_local") else p
                for n, p in self._params().items()}

    def step(self, feeds: dict[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        """Forward and backward through the parallelized linears (DTensor's collectives inside),
        the loss times `weight` (schemes/base.py), then the entry's optimizer on this rank's
        replicated weights and local shards."""
        import torch
        t = self.trainer
        params = self._params()
        env = dict(t.values)
        env.update({name: torch.from_numpy(a) for name, a in
                    t.batch(feeds, t.train_inputs).items()})
        with torch.enable_grad():
            loss = t.train_module.run(env)
            grads = torch.autograd.grad(loss * weight if weight != 1.0 else loss,
                                        list(params.values()), allow_unused=True)
        local = self._local()
        with torch.no_grad():
            named = {n: (torch.zeros_like(local[n]) if g is None else
                         g.to_local() if hasattr(g, "to_local") else g)
                     for n, g in zip(params, grads)}
            t.optimizer.step(local, named, self.state, lr)
        self._steps += 1
        return float(loss.item())

    @contextmanager
    def evaluated(self) -> Any:
        """The whole model on every rank (full_tensor is collective), in ONNX's layout."""
        full = {}
        for name, p in self._params().items():
            if hasattr(p, "full_tensor"):
                a = p.full_tensor().detach().numpy()
                full[name] = np.ascontiguousarray(a.T if self.weights[name][2] else a)
            else:
                full[name] = p.detach().numpy().copy()
        self.full = full
        try:
            yield
        finally:
            self.full = {}

    def handed(self) -> dict[str, np.ndarray]:
        from d500.distributed.ddp import with_buffers
        return with_buffers(self.full, self.trainer)

    def finish(self) -> None:
        """The process group closes on every rank together."""
        close_group()

    def memory(self) -> dict[str, float]:
        """Bytes of the replicated weights and this rank's local shards (parameters, their
        gradients: the same size) and of the optimizer state over them."""
        from d500.distributed.ddp import held
        return held(self._local().values(), self.state)

    def figures(self) -> dict[str, float]:
        return {}

    def details(self) -> dict[str, Any]:
        return {"tensor_split": self.split.record(),
                "dtensor_allreduces_per_step": (self.traffic.calls / self._steps
                                                if self._steps else 0)}


def _passed(node: Any, x: Any) -> Any:
    """A bias Add whose bias the Linear before it already added."""
    return x


def build(model: Any, spec: Any, comm: Communicator, backend_cls: Any, optimizer: Any,
          native: bool, limit: float) -> tuple[Any, DTensorScheme]:
    """(trainer, scheme) of this rank: `model` split spec.tensor ways, rank t's model
    translated (its Reshape targets), the scheme over it."""
    from d500.distributed.ddp import whole_world
    from d500.distributed.tensor.split import find
    whole_world(spec, comm, "tensor")
    split = find(model, spec.tensor, where=f"{spec.where}: field 'distributed.tensor'")
    mine, _ = split.rank_model(comm.rank % spec.tensor)
    trainer = backend_cls.prepare(mine).trainer(optimizer, loss="loss", native=native)
    return trainer, DTensorScheme(trainer, comm, split, timeout=limit, **spec.options)
