"""ZeRO stage 3 layer by layer (Rajbhandari et al., SC'20; torch FSDP2's schedule): each data rank
keeps its rows of every parameter; a layer's parameters are allgathered just before its forward
and again before its backward, and freed after each; its gradients are reduce-scattered at once.

    scheme = Zero3(model, backend_cls, optimizer, comm)   # the ONNX model, cut into layers
    scheme.start()                                        # rank 0's parameters, then own rows
    loss = scheme.step(feeds, lr, weight)

A layer is a node that reads parameters (a Gemm, a Conv) with the parameter-free nodes after it
(the first layer also takes those before it), consecutive layers merged while together they hold
no more bytes than the largest (fewer collectives, the same peak), and a group under a tenth of
the largest (SMALL) gathered with the one before it. Each is translated by the
backend as a sub-model whose parameters are inputs (d500.distributed.tensor.rank's segments), so
the framework holds no weights between calls. Forward runs each layer on the gathered weights,
keeping only its inputs; backward walks the layers in reverse, gathers each again and runs
`Executable.gradients(grad_outputs=...)` (a forward recomputed, then the backward), as a
pipeline stage does. The collectives are nonblocking (MPI_Iallgatherv, MPI_Ireduce_scatter):
a layer is gathered once the one before it is freed (one layer held at a time, the default:
PREFETCH), or, with option `prefetch: true`, as FSDP2 does, the next layer's gather is under
way while the current layer computes (two layers held); the reduce-scatters run behind the
backward, waited for before the update. Each parameter's rows are cut as torch FSDP2
cuts them (Shard(0), rank r rows n*r//N .. n*(r+1)//N, no padding), so a rank holds about B/N of
every layer; the optimizer updates each row block as a whole tensor, which equals the whole
tensor's update for elementwise rules only (SGD, momentum, Adam, AdamW, Adagrad): an optimizer
whose update of a part differs (LARS's and LAMB's per-tensor norms) is refused with one line,
found by running it both ways at the start.

Memory per rank, counted on the NumPy arrays the scheme holds: between steps its rows b_r
(`param_bytes`), the averaged gradient of them (`grad_bytes`) and the optimizer state over them;
inside a step at most b_r + the largest layer's parameters (`peak_param_bytes`, the most held
right after any gather; prefetching, b_r + two layers gathered in turn). The judge computes both
from its own copy of the graph (`shard_bytes`, `peak_bytes`) and believes no rank that claims
less. Bytes per step and rank: every layer's allgather twice (once for the last, whose forward
and backward run at once) and one reduce-scatter, as FSDP2's. A model with running statistics
(BatchNormalization) is not cut: d500.distributed.schemes.zero gathers it whole.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from d500.distributed.comm import Pending
from d500.distributed.schemes.base import Scheme, state_bytes
from d500.errors import ConfigError


def rows(n: int, ranks: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s rows of a tensor of `n` rows (FSDP2's Shard(0) without padding)."""
    return n * rank // ranks, n * (rank + 1) // ranks


def _part(a: np.ndarray, ranks: int, rank: int) -> np.ndarray:
    """Rank `rank`'s rows of `a` (a 0-d array as one row)."""
    a = a.reshape(1) if a.ndim == 0 else a
    lo, hi = rows(a.shape[0], ranks, rank)
    return a[lo:hi]


def layered(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[Any], list[str]]:
    """(`model` with its float parameters as graph inputs, its layers as segments of
    d500.distributed.tensor.rank, the parameter names in graph order)."""
    from d500.distributed.tensor.rank import segments
    g = model.graph
    params = [t.name for t in g.initializer
              if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [t for t in out.graph.initializer if t.name not in set(params)]
    moved = [helper.make_tensor_value_info(t.name, t.data_type, t.dims)
             for t in out.graph.initializer if t.name in set(params)]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    out.graph.input.extend(moved)
    return out, segments(out, _grouped(g, params)), params


PREFETCH = False  # the default: one layer gathered at a time, issue 20's memory target (a rank
# holds 1/N of the parameters and optimizer state plus one layer); prefetch held two for 0-5% of
# step time (benchmarks/zero3_prefetch.py, README)
SMALL = 0.1  # a group under this share of the largest layer's bytes joins the group before it


def _grouped(g: onnx.GraphProto, params: list[str]) -> list[int]:
    """Each node's group: a new layer starts at each node that reads parameters, consecutive
    layers are merged while their bytes stay within the largest layer's (fewer gathers, the same
    peak), and a group left under SMALL of the largest joins the one before it (a bucket: one
    gather and call fewer, at most SMALL more held; the MLP's 2.6 kB output layer)."""
    sizes = {t.name: 4 * math.prod(t.dims) for t in g.initializer if t.name in set(params)}
    layers, reads = [], []  # each node's layer; each layer's parameters
    for node in g.node:
        mine = {i for i in node.input if i in sizes}
        if mine and reads and reads[-1]:
            reads.append(set())
        if not reads:
            reads.append(set())
        reads[-1] |= mine
        layers.append(len(reads) - 1)
    largest = max(sum(sizes[p] for p in r) for r in reads)
    group, held, into = 0, set(), []
    for r in reads:
        if held and sum(sizes[p] for p in held | r) > largest:
            group, held = group + 1, set()
        held |= r
        into.append(group)
    groups: list[set[str]] = [set() for _ in range(into[-1] + 1)]
    for r, k in zip(reads, into):
        groups[k] |= r
    joined, k = [], -1
    for j, held in enumerate(groups):
        if not (j and sum(sizes[p] for p in held) < SMALL * largest):
            k += 1
        joined.append(k)
    return [joined[into[k]] for k in layers]


def _sizes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in model.graph.initializer}


def shard_bytes(model: onnx.ModelProto, spec: Any, world: int) -> dict[int, int]:
    """Each rank's parameter bytes between steps (rank -> bytes) at `world` ranks: its rows of
    every float32 parameter (a model with running statistics: zero.shard_bytes's blocks)."""
    from d500.backends.training_graph import running_statistics
    if running_statistics(model):
        from d500.distributed.schemes.zero import shard_bytes as whole
        return whole(model, spec, world)
    n = spec.dims(world)["data"]
    _, _, params = layered(model)
    shapes = _sizes(model)
    return {r: sum(4 * _rows_size(shapes[p], n, r) for p in params) for r in range(n)}


def peak_bytes(model: onnx.ModelProto, spec: Any, world: int) -> dict[int, int]:
    """The parameter bytes each rank must hold at least inside a step (rank -> bytes): its rows
    and the most gathered at once: the largest layer (one at a time, the default), or two
    layers in turn with option `prefetch: true` (a layer's gather under way while the one
    before it is held); a model with running statistics: the whole model."""
    from d500.backends.training_graph import running_statistics
    from d500.distributed.tensor.rank import differentiable
    shapes = _sizes(model)
    form, layers, params = layered(model)
    whole = sum(4 * math.prod(shapes[p]) for p in params)
    if running_statistics(model):
        return dict.fromkeys(range(spec.dims(world)["data"]), whole)
    sizes = [sum(4 * math.prod(shapes[p]) for p in _held(layer, params)) for layer in layers]
    order = gather_order(_reached(layers, differentiable(form, set(params))))
    ahead = 1 if spec.options.get("prefetch", PREFETCH) else 0
    largest = max(sum(sizes[k] for k in order[i:i + 1 + ahead]) for i in range(len(order)))
    return {r: b + largest for r, b in shard_bytes(model, spec, world).items()}


def least_sent(model: onnx.ModelProto, spec: Any, world: int, batch: int) -> dict[int, int]:
    """The bytes each rank must send a step at the least (rank -> bytes), as the Communicator
    counts them: each layer's allgather before its forward and, where a gradient reaches it,
    again before its backward (the last layer's are one), and its reduce-scatter (`batch` is
    unused: ZeRO's bytes do not depend on it)."""
    from d500.backends.training_graph import running_statistics
    from d500.distributed.comm import gather_counts
    from d500.distributed.tensor.rank import differentiable
    n = spec.dims(world)["data"]
    if running_statistics(model):  # the whole model gathered once a step (zero.py's blocks)
        held = shard_bytes(model, spec, world)
        return {r: gather_counts(list(held.values()), r)[0] + sum(held.values()) - held[r]
                for r in range(n)}
    form, layers, params = layered(model)
    shapes = _sizes(model)
    reached = _reached(layers, differentiable(form, set(params)))
    out = dict.fromkeys(range(n), 0)
    for i, layer in enumerate(layers):
        blocks = [4 * sum(_rows_size(shapes[p], n, r) for p in _held(layer, params))
                  for r in range(n)]
        gathers = 2 if reached[i] and i < len(layers) - 1 else 1
        for r in range(n):
            out[r] += gathers * gather_counts(blocks, r)[0] + sum(blocks) - blocks[r]
    return out


def _reached(layers: list[Any], diff: set[str]) -> list[bool]:
    """Whether a gradient reaches each layer from the loss (the last layer's always does): the
    layers whose parameters are gathered again for a backward."""
    reached = [True] * len(layers)
    for i in range(len(layers) - 2, -1, -1):
        reached[i] = any(o in diff and o in later.inputs and reached[j]
                         for j, later in enumerate(layers) if j > i for o in layers[i].outputs)
    return reached


def gather_order(reached: list[bool]) -> list[int]:
    """The layers in the order a step gathers them: each before its forward, then those a
    gradient reaches before their backward, last to first (the last layer's two are one)."""
    end = len(reached) - 1
    return [*range(end + 1), *(i for i in range(end - 1, -1, -1) if reached[i])]


class _Later:
    """A gather started only when waited for (Zero3 without prefetch)."""

    def __init__(self, start: Any):
        self.start = start

    def wait(self) -> Any:
        return self.start()


def _nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())


def _rows_size(shape: tuple[int, ...], ranks: int, rank: int) -> int:
    """Elements in rank `rank`'s rows of a tensor of `shape`."""
    if not shape:
        return int(rank == ranks - 1)
    lo, hi = rows(shape[0], ranks, rank)
    return (hi - lo) * math.prod(shape[1:])


def _held(layer: Any, params: list[str]) -> list[str]:
    """The parameters a layer reads, in graph order."""
    mine = set(layer.inputs)
    return [p for p in params if p in mine]


class Rows:
    """This rank's rows of every parameter as the part of a Trainer a Scheme uses (before
    `start` cuts them: the whole model)."""

    buffer_names: list[str] = []
    state: Any = None  # the optimizer state of the rows (a checkpoint's, d500.distributed.resuming)

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    @property
    def parameter_names(self) -> list[str]:
        return list(self.arrays)

    def parameters(self) -> dict[str, np.ndarray]:
        return self.arrays

    def parameter_views(self) -> dict[str, np.ndarray]:
        return self.arrays

    def set_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        self.arrays.update({n: np.array(v, dtype=np.float32) for n, v in values.items()})

    def buffers(self) -> dict[str, np.ndarray]:
        return {}

    def set_buffers(self, values: Mapping[str, np.ndarray]) -> None:
        if values:
            raise ConfigError("shard: zero3 layer by layer holds no running statistics")


class Zero3(Scheme):
    """Per-layer ZeRO-3 of the ONNX `model` over the data ranks of `comm` (module docstring)."""

    name = "zero3"

    def __init__(self, model: onnx.ModelProto, backend_cls: Any, optimizer: Any, comm: Any,
                 loss: str = "loss", where: str = "shard: zero3", prefetch: bool = PREFETCH,
                 **kwargs: Any):

        from d500.distributed.pipeline.partition import value_infos
        from d500.distributed.tensor.rank import differentiable, submodel
        form, self.layers, self.names = layered(model)
        whole = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer
                 if t.name in set(self.names)}
        for n, a in whole.items():
            if a.dtype != np.float32:
                raise ConfigError(f"{where} shards float32 parameters; '{n}' is {a.dtype}")
        super().__init__(Rows(whole), comm, **kwargs)
        if loss not in self.layers[-1].outputs:
            raise ConfigError(f"{where}: the loss '{loss}' is not made by the model's last layer "
                              f"(it must follow every parameter)")
        self.loss_name, self.optimizer = loss, optimizer
        self.shapes = {n: a.shape for n, a in whole.items()}
        types, diff = value_infos(form), differentiable(form, set(self.names))
        for layer in self.layers:
            layer.exe = backend_cls.prepare(submodel(form, layer, types))
            layer.params = _held(layer, self.names)
            layer.wrt = [*layer.params,
                         *(i for i in layer.inputs if i in diff and i not in set(layer.params))]
        read = {i for layer in self.layers for i in layer.inputs}
        self.constants = {t.name: numpy_helper.to_array(t) for t in form.graph.initializer
                          if t.name in read}  # (a shape read by two layers: the later's input)
        check_elementwise(optimizer, whole, self.size, where)
        self.counts = [[sum(_rows_size(self.shapes[p], self.size, r) for p in layer.params)
                        for r in range(self.size)] for layer in self.layers]
        self.reached = _reached(self.layers, diff)
        if not isinstance(prefetch, bool):
            raise ConfigError(f"{where}: distributed.options' prefetch is true or false, "
                              f"got {prefetch!r}")
        self.prefetch = prefetch  # the next layer's gather under way during this one's
        self.order = gather_order(self.reached)
        self.state: Any = None
        self.held = 0  # parameter bytes held after the last step (measured)
        self.peak = 0  # parameter bytes held right after a gather, at most (measured)
        self.gathered: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        """Rank 0's parameters everywhere, then each rank keeps its own rows only."""
        super().start()
        mine = {n: np.array(_part(a, self.size, self.rank)) for n, a in self.params.get().items()}
        self.trainer.arrays.clear()
        self.trainer.arrays.update(mine)
        self._param_buckets = None
        self.state = self.trainer.state = self.optimizer.init(mine, "numpy")  # checkpointed

    # ------------------------------------------------------------------ one step
    def step(self, feeds: Mapping[str, np.ndarray], lr: float, weight: float = 1.0) -> float:
        values: dict[str, np.ndarray] = {**self.constants, **feeds}
        stash = []
        order = iter(self.order[1:])  # the layers gathered after the first, in turn
        coming = self._fetch(self.order[0], 0)
        for i, layer in enumerate(self.layers[:-1]):
            w = self._arrived(i, coming)
            coming = self._ahead(order, w)  # the next layer's, while this one runs
            ins = {n: values[n] for n in layer.inputs if n not in w}
            stash.append(ins)
            outs = layer.exe.run({**ins, **w})
            del w
            values.update({o: outs[layer.exe.output_index(o)] for o in layer.outputs})
        end = len(self.layers) - 1
        last = self.layers[end]
        w = self._arrived(end, coming)
        coming = self._ahead(order, w)  # the first backward gather, during the last layer's
        seed = {self.loss_name: np.asarray(weight, dtype=np.float32)}
        ins = {n: values[n] for n in last.inputs if n not in w}
        del values
        outs, g = last.exe.gradients({**ins, **w}, grad_outputs=seed, wrt=last.wrt)
        del w
        loss = float(outs[last.exe.output_index(self.loss_name)])
        flowing: dict[str, np.ndarray] = {}
        sending = [(end, self._scatter(end, g, flowing))]  # reduce-scatters under way
        for i in range(end - 1, -1, -1):
            layer, ins = self.layers[i], stash.pop()
            given = {o: flowing.pop(o) for o in layer.outputs if o in flowing}
            if self.reached[i]:
                w = self._arrived(i, coming)
                coming = self._ahead(order, w)
                _, g = layer.exe.gradients({**ins, **w}, grad_outputs=given, wrt=layer.wrt)
                del w
            else:  # nothing it made reaches the loss: zero gradients, the same collectives
                g = {p: np.zeros(self.shapes[p], np.float32) for p in layer.params}
            sending.append((i, self._scatter(i, g, flowing)))
        grads: dict[str, np.ndarray] = {}
        for i, pending in sending:
            self._take(i, pending, grads)
        mine = self.trainer.arrays
        self.optimizer.step(mine, {n: grads[n] for n in mine}, self.state, lr)
        self.held = self._held()
        self.steps += 1
        return loss

    def _ahead(self, order: Iterator[int], held: Mapping[str, np.ndarray]) -> Any:
        """The next layer's gather of `order` (None after the last): started now, while `held`
        is held, when prefetching; else started when waited for (after `held` is freed)."""
        index = next(order, None)
        if index is None:
            return None
        if self.prefetch:
            return self._fetch(index, _nbytes(held))
        return _Later(lambda: self._fetch(index, 0).wait())

    def _fetch(self, index: int, holding: int) -> Any:
        """Start gathering layer `index`'s parameters (MPI_Iallgatherv of every rank's rows)
        while `holding` bytes of another layer's are held."""
        layer, counts = self.layers[index], self.counts[index]
        mine = self.trainer.arrays
        flat = (np.concatenate([mine[p].reshape(-1) for p in layer.params]) if layer.params
                else np.empty(0, np.float32))
        self.peak = max(self.peak, self._held() + holding + 4 * sum(counts))
        if self.size == 1:
            return Pending(None, [flat], None)
        return self.comm.iallgatherv(flat, counts)

    def _arrived(self, index: int, pending: Any) -> dict[str, np.ndarray]:
        """Layer `index`'s whole parameters once `pending` (its `_fetch`) has arrived."""
        parts = pending.wait()
        out, at = {}, [0] * self.size
        for p in self.layers[index].params:
            shape = self.shapes[p]
            pieces = []
            for r, part in enumerate(parts):
                k = _rows_size(shape, self.size, r)
                pieces.append(part[at[r]:at[r] + k])
                at[r] += k
            out[p] = np.concatenate(pieces).reshape(shape)
        return out

    def _gather(self, index: int) -> dict[str, np.ndarray]:
        """Layer `index`'s whole parameters from every rank's rows (allgatherv), no other held."""
        return self._arrived(index, self._fetch(index, 0))

    def _scatter(self, index: int, g: Mapping[str, np.ndarray],
                 flowing: dict[str, np.ndarray]) -> Any:
        """Start reduce-scattering layer `index`'s parameter gradients (MPI_Ireduce_scatter);
        its inputs' gradients into `flowing`."""
        layer = self.layers[index]
        for n in layer.wrt[len(layer.params):]:
            if n in g:  # (a layer nothing reached gives its inputs no gradient)
                flowing[n] = flowing[n] + g[n] if n in flowing else np.asarray(g[n])
        if not layer.params:
            return None
        flat = np.concatenate([_part(np.asarray(g[p], np.float32), self.size, r).reshape(-1)
                               for r in range(self.size) for p in layer.params])
        return self.comm.ireduce_scatter(flat, self.counts[index], op="average")

    def _take(self, index: int, pending: Any, grads: dict[str, np.ndarray]) -> None:
        """Layer `index`'s reduce-scattered gradients (`pending`, its `_scatter`) into this
        rank's rows of `grads` (summed where a parameter is read by two layers)."""
        if pending is None:
            return
        mine, at = pending.wait(), 0
        for p in self.layers[index].params:
            part = self.trainer.arrays[p]
            piece = mine[at:at + part.size].reshape(part.shape)
            at += part.size
            grads[p] = grads[p] + piece if p in grads else piece

    def _held(self) -> int:
        return sum(a.nbytes for a in self.trainer.arrays.values())

    # ------------------------------------------------------------------ the whole model
    def _whole(self) -> dict[str, np.ndarray]:
        """Every parameter whole on every rank (one allgatherv per layer)."""
        out: dict[str, np.ndarray] = {}
        for i in range(len(self.layers)):
            out.update({p: a for p, a in self._gather(i).items() if p not in out})
        return out

    @contextlib.contextmanager
    def _evaluate(self) -> Iterator[None]:
        whole = self._whole()
        self.gathered = whole if self.rank == 0 else None
        try:
            yield
        finally:
            self.gathered = None

    def handed(self) -> dict[str, np.ndarray]:
        if self.gathered is None:
            raise RuntimeError("handed() outside evaluated() or off rank 0")
        return {n: np.array(a, copy=True) for n, a in self.gathered.items()}

    def _finish(self) -> None:
        """Every rank holds the whole final model (its rows no longer updated)."""
        whole = self._whole()
        self.trainer.arrays.clear()
        self.trainer.arrays.update(whole)

    # ------------------------------------------------------------------ figures
    def memory(self) -> dict[str, float]:
        held = float(self.held if self.steps else self._held())  # measured after the last step
        return {"param_bytes": held, "grad_bytes": held,
                "optimizer_bytes": float(state_bytes(self.state))}

    def figures(self) -> dict[str, float]:
        return {**self.memory(), "zero_stage": 3.0, "layers": float(len(self.layers)),
                "peak_param_bytes": float(self.peak)}


def check_elementwise(optimizer: Any, whole: dict[str, np.ndarray], ranks: int,
                      where: str = "shard: zero3") -> None:
    """A ConfigError unless two steps of `optimizer` on every rank's rows equal two steps on the
    whole tensors (random gradients; 1e-5 relative)."""
    if ranks == 1:
        return
    rng = np.random.default_rng(0)
    grads = {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in whole.items()}
    opt = copy.deepcopy(optimizer)
    ref = {n: a.copy() for n, a in whole.items()}
    state = opt.init(ref, "numpy")
    for _ in range(2):
        opt.step(ref, grads, state, 0.01)
    for r in range(ranks):
        mine = {n: np.array(_part(a, ranks, r)) for n, a in whole.items()}
        own = {n: np.array(_part(a, ranks, r)) for n, a in grads.items()}
        state = opt.init(mine, "numpy")
        for _ in range(2):
            opt.step(mine, own, state, 0.01)
        for n, a in mine.items():
            want = _part(ref[n], ranks, r)
            if not np.allclose(a, want, rtol=1e-5, atol=1e-7):
                raise ConfigError(f"{where}: zero3 updates each rank's rows of a parameter "
                                  f"apart, and optimizer '{getattr(optimizer, 'name', optimizer)}' "
                                  f"updates a part of '{n}' otherwise than the whole (a "
                                  f"per-tensor norm?): use shard: zero2, or an elementwise "
                                  f"optimizer")


def build(model: onnx.ModelProto, spec: Any, comm: Any, backend_cls: Any, optimizer: Any,
          native: bool = False) -> Zero3:
    """This rank's Zero3 over the data dimension `comm`."""
    if native:
        raise ConfigError(f"{spec.where}: field 'distributed.shard': zero3 updates each rank's "
                          f"rows with d500's framework-neutral optimizer; use native: false")
    return Zero3(model, backend_cls, optimizer, comm, bucket_bytes=spec.bucket_bytes,
                 where=f"{spec.where}: field 'distributed.shard'", **spec.options)
