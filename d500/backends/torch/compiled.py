"""torch:compiled: the ONNX graph traced once into a static torch.fx program, then torch.compile'd.

The walker (`executable.Plan`) runs once under `make_fx` on real inputs: what comes out is one
aten-level `torch.fx.GraphModule` with no walker, no op functions and no Python branches left.
Its parameters stay the executable's own tensors (so `set_parameters` reaches it). Graph inputs
whose *values* the walk read (Reshape targets, Slice bounds, TopK's K, a NonZero's input, ...)
are baked into the program as constants, and the program is keyed by them: a new value (or a
new input shape) is a new program, never a silently stale one. `torch.compile` then sees one
graph (fullgraph, static shapes), which Inductor compiles once; its artefacts are cached under
$D500_HOME/torch-inductor, so a second process reuses them.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch._inductor.config
import torch.fx
from torch.fx.experimental import proxy_tensor
from torch.overrides import TorchFunctionMode

from d500.backends.torch.executable import TorchExecutable
from d500.errors import UsageError
from d500.paths import CHOSEN

# Tensor methods that hand a tensor's values to Python: a trace that calls them on a value
# computed from a graph input has burnt that value in.
_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__bool__,
          torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
          torch.Tensor.__array__, torch.Tensor.__complex__}


def inductor_cache() -> str:
    """Inductor's cache directory (its generated code, compiled kernels, FX-graph and
    AOTAutograd caches): $D500_HOME/cache/torch-inductor unless the user set
    TORCHINDUCTOR_CACHE_DIR to a folder of their own (Inductor itself sets it to its default
    under /tmp when imported); set before each compile, so a second process reuses it. The
    folder d500 chose is named in D500_TORCHINDUCTOR_CACHE_DIR, so that a later D500_HOME
    replaces it in this process and in the workers that inherit its environment."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from d500.paths import cache
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given and given not in (default_cache_dir(), os.environ.get(_CHOSEN)):
        return given
    folder = str(cache("torch-inductor"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[_CHOSEN] = folder
    return folder


_CHOSEN = CHOSEN["TORCHINDUCTOR_CACHE_DIR"]  # the folder inductor_cache chose (not the user)

# A program of at least this many aten calls runs through Inductor's C++ wrapper (its calls in
# one compiled C++ function) rather than its Python one: light ResNet-50 (394 calls) took 7-9%
# less CPU per inference with it, side by side (README, "torch:compiled against eager and
# onnxruntime"); the C++ build adds minutes to a cold compile, which the short graphs of the
# node suite would pay for nothing.
CPP_WRAPPER_FROM = 100


def calls(gm: torch.fx.GraphModule) -> int:
    """How many aten calls a traced program makes."""
    return sum(n.op == "call_function" for n in gm.graph.nodes)


def _placeholders(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The placeholders (graph inputs) a traced value is computed from."""
    seen, todo, found = set(), [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            found.add(n)
        todo.extend(n.all_input_nodes)
    return found


class _ReadsInputs(Exception):  # noqa: N818 - not an error: the trace starts again
    """A trace stopped where Python read values computed from graph inputs (their positions)."""

    def __init__(self, positions: set[int]):
        super().__init__(sorted(positions))
        self.positions = positions


class _ValueReads(TorchFunctionMode):
    """Inside a make_fx trace: stops it (_ReadsInputs) where Python reads the values of a tensor
    computed from graph inputs (through tolist, item, numpy, bool, ...), naming those inputs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS and args and isinstance(args[0], torch.Tensor):
            mode = proxy_tensor.get_innermost_proxy_mode()
            slot = proxy_tensor.get_proxy_slot(args[0], mode.tracer, None) if mode else None
            if slot is not None and (read := _placeholders(slot.proxy.node)):
                places = [n for n in mode.tracer.graph.nodes if n.op == "placeholder"]
                raise _ReadsInputs({places.index(p) for p in read})
        return func(*args, **(kwargs or {}))


def _data_dependent_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The traced calls whose output shape or value depends on their inputs' values (NonZero,
    Unique, masked selects)."""
    def tags(node: torch.fx.Node) -> Sequence[Any]:
        return getattr(node.target, "tags", ()) if node.op == "call_function" else ()
    return [n for n in gm.graph.nodes if torch.Tag.dynamic_output_shape in tags(n)
            or torch.Tag.data_dependent_output in tags(n)]


def _data_dependent(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Placeholders that decide the shape of a traced value (NonZero, Unique, masked selects):
    the trace burnt that shape in, so their values are part of the program."""
    found: set[torch.fx.Node] = set()
    for node in _data_dependent_nodes(gm):
        found |= _placeholders(node)
    return found


def _read_in_a_kernel(err: BaseException | None) -> bool:
    """Whether make_fx stopped a trace because a kernel read a traced tensor's value."""
    while err is not None:
        if isinstance(err, RuntimeError) and "_local_scalar_dense" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def trace(forward: Any, feeds: dict[str, Any], grad: bool = False
          ) -> tuple[torch.fx.GraphModule, list[str]]:
    """`forward(**feeds)` as a static fx program over the feeds it does not bake, and the names
    it baked (the inputs whose values decided the program; non-tensor inputs always). `grad`:
    trace with autograd on, so that a `torch.autograd.grad` inside `forward` is traced into
    the program as its backward ops."""
    baked = {n for n, v in feeds.items() if not isinstance(v, torch.Tensor)}
    while True:
        free = [n for n in feeds if n not in baked]

        def static(*values: torch.Tensor) -> Any:
            env = {n: feeds[n] for n in baked}
            env.update(zip(free, values))
            with _ValueReads():
                return forward(**env)

        try:
            with torch.set_grad_enabled(grad):
                gm = proxy_tensor.make_fx(static, tracing_mode="real",
                                          _error_on_data_dependent_ops=False)(
                    *[feeds[n] for n in free])
        except _ReadsInputs as read:
            baked |= {free[i] for i in read.positions}
            continue
        except Exception as err:
            if free and _read_in_a_kernel(err):  # a kernel read a value (one_hot's range check):
                baked |= set(free)  # which input it came from is unknown, so all are baked
                continue
            raise
        places = [n for n in gm.graph.nodes if n.op == "placeholder"]
        named = dict(zip(places, free))
        more = {named[p] for p in _data_dependent(gm) if p in named}
        if not more:
            return gm, sorted(baked)
        baked |= more


def static_program(forward: Any, feeds: dict[str, Any], what: str, grad: bool = False
                   ) -> tuple[torch.fx.GraphModule, list[str]]:
    """`trace`, its failure one UsageError line naming `what` could not be traced."""
    try:
        return trace(forward, feeds, grad)
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - the one line says what could not be traced
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(f"backend 'torch:compiled': {what} cannot be traced into a static "
                         f"program: {first}") from err


def key(feeds: dict[str, Any], baked: Sequence[str]) -> tuple:
    """What a static program is specialised to: every input's dtype and shape, and the values
    of the inputs it baked."""
    def one(name: str, value: Any) -> tuple:
        if isinstance(value, torch.Tensor):
            shape = (str(value.dtype), tuple(value.shape), value.device.type)
            if name in baked:
                data = value.detach().cpu().contiguous().view(-1)
                shape += (hashlib.sha256(data.view(torch.uint8).numpy().tobytes()
                                         if data.numel() else b"").hexdigest(),)
            return shape
        return (type(value).__name__, repr(_plain(value)))
    return tuple(one(n, v) for n, v in sorted(feeds.items()))


def _plain(value: Any) -> Any:
    """A non-tensor input as something whose repr identifies it (lists of tensors, arrays)."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Compiled:
    """The static programs of one executable, one per key, each compiled by torch.compile;
    `compile_time` is the seconds the first call of the newest one took (trace + compile)."""

    def __init__(self, forward: Any, backend: str = "inductor", freezing: bool = True):
        self.forward = forward
        self.backend = backend
        self.freezing = freezing
        self.programs: dict[tuple, tuple[Any, list[str], list[str]]] = {}
        self.baked: dict[tuple, list[str]] = {}  # key without values -> names it baked
        self.compile_time: float | None = None
        self.cache: str | None = None  # the newest program's: 'warm' when compiled here before
        self.wrapper: str | None = None  # the newest program's Inductor wrapper: 'C++', 'Python'
        self.built_at = self.version()

    def version(self) -> int:
        """The sum of the parameters' and buffers' in-place version counters: it grows with every
        write to them (set_parameters, an optimizer step on `native`), which freezing would not
        see in a compiled program."""
        return sum(t._version for t in self.forward.values.values()
                   if isinstance(t, torch.Tensor))

    def __call__(self, feeds: dict[str, Any]) -> Any:
        version = self.version()
        if version != self.built_at:  # a parameter changed in place: frozen programs are stale
            self.programs.clear()
            self.built_at = version
        shapes = key(feeds, ())
        baked = self.baked.get(shapes)
        if baked is not None:
            found = self.programs.get(key(feeds, baked) if baked else shapes)
            if found is not None:
                fn, free, _ = found
                return fn(*[feeds[n] for n in free])
        return self._build(feeds, shapes)

    def _build(self, feeds: dict[str, Any], shapes: tuple) -> Any:
        inductor_cache()
        t0 = time.perf_counter()
        gm, baked = static_program(self.forward, feeds, "the model")
        free = [n for n in feeds if n not in baked]
        fn = torch.compile(gm, backend=self.backend, fullgraph=True, dynamic=False)
        # Freezing folds a NonZero of constants into a constant whose unbacked size Inductor
        # then loses (an assertion in torch 2.13): such programs compile unfrozen.
        freeze = self.freezing and not _data_dependent_nodes(gm)
        wrapper = calls(gm) >= CPP_WRAPPER_FROM
        from d500.backends.torch import compile_cache
        program = compile_cache.program_key(gm, {"backend": self.backend, "freezing": freeze,
                                                 "cpp_wrapper": wrapper})
        warm = compile_cache.seen(program)
        self.wrapper = "C++" if wrapper else "Python"
        # A 0-d constant is inlined into the kernels as a literal, yet with freezing Inductor's
        # graph cache keys it by shape and dtype only (torch 2.13): two programs that differ
        # only in such a constant (Elu's alpha) shared one cached program, the first one's
        # value. Kept as tensor constants, they are read at run time from this program's own.
        with torch.no_grad(), torch._inductor.config.patch(
                freezing=freeze, cpp_wrapper=wrapper, always_keep_tensor_constants=freeze):
            out = fn(*[feeds[n] for n in free])
        compile_cache.mark(program)
        self.compile_time = time.perf_counter() - t0
        self.cache = "warm" if warm else "cold"
        self.baked[shapes] = baked
        self.programs[key(feeds, baked)] = (fn, free, baked)
        return out


class CompiledExecutable(TorchExecutable):
    """A torch executable whose `run` is the compiled static program and whose `trainer`'s step
    is one too; `gradients` (level 0) refuses (eager's would run under this mode's name)."""

    backend_name = "torch:compiled"

    def __init__(self, model: Any, device: str = "CPU"):
        super().__init__(model, device)
        self._compiled = Compiled(self._module)

    @property
    def compile_time(self) -> float | None:
        """Seconds the newest static program's first call took: trace, torch.compile and
        Inductor's code generation (or its cache's answer)."""
        return self._compiled.compile_time

    @property
    def compile_cache(self) -> str | None:
        """'warm' when the newest program was compiled before in the cache under $D500_HOME
        (d500.backends.torch.compile_cache), else 'cold'."""
        return self._compiled.cache

    @property
    def baked_inputs(self) -> list[str]:
        """The inputs whose values some program was specialised to. A timed run records them:
        a data input baked (a NonZero on the image) lets Inductor fold the whole model into
        constants for the one input a benchmark repeats, a speed no new input would see."""
        return sorted({n for names in self._compiled.baked.values() for n in names})

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        feeds = self._feeds(inputs)
        with torch.no_grad():
            return self._outputs(self._compiled(feeds))

    def gradients(self, inputs: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("torch:compiled compiles inference and the training step "
                                  "(trainer); level 0's gradients run on the backend 'torch'")

    def trainer(self, optimizer: Any, loss: str = "loss", native: bool = False,
                precision: str = "fp32") -> Any:
        """The compiled training step (d500.backends.torch.compiled_trainer), in float32."""
        if precision != "fp32":
            raise UsageError(f"backend 'torch:compiled' trains in fp32 only; precision "
                             f"'{precision}' trains on the backend 'torch'")
        from d500.backends.torch.compiled_trainer import CompiledTrainer
        return CompiledTrainer(self, optimizer, loss, native)

    def settings(self) -> dict[str, Any]:
        return {"compiler": "torch.compile", "backend": self._compiled.backend,
                "fullgraph": True, "dynamic": False, "freezing": self._compiled.freezing,
                "cpp_wrapper": f"from {CPP_WRAPPER_FROM} aten calls",
                "wrapper": self._compiled.wrapper}
