"""torch's part of level 0: how a torch operator runs (TorchRunner: forward under no_grad,
gradients by autograd, through the operator's own backward as a torch.autograd.Function), and
how torch's own backward of one operator case is timed (`backward`). Its FRAMEWORK names both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from d500.operators.adapters import Runner, as_tuple, pad_any
from d500.operators.backward import BackwardCall
from d500.operators.base import CustomOperator


class TorchRunner(Runner):
    @property
    def has_gradients(self) -> bool:
        return True  # its own backward, or torch autograd of forward

    def to_native(self, arrays):
        from d500.backends.torch.dtypes import from_numpy
        return [from_numpy(np.array(a, copy=True)) for a in arrays]

    def call(self, native):
        import torch
        with torch.no_grad():
            return self.op.forward(*native)

    def _numpy(self, value):
        from d500.backends.torch.dtypes import to_numpy
        return to_numpy(value)

    def _adder(self, arrays, native, k):
        """NumPy's in-place add where the tensor shares NumPy's memory (torch.add there cost
        the host twice the CPU beside torch.dot); else (bfloat16) torch.add into the tensor,
        the offsets tiled as `add_tiled` does. The sum rounds as NumPy's does."""
        import torch

        from d500.backends.torch.dtypes import from_numpy
        from d500.operators.adapters import writable_view
        if writable_view(native[k]) is not None or not (
                isinstance(native[k], torch.Tensor) and native[k].is_floating_point()):
            return super()._adder(arrays, native, k)
        given, out = native[k].clone().reshape(-1), native[k].view(-1)

        def add(offsets):
            _add_tiled(given, from_numpy(offsets), out)
        return add

    def shifted_backward(self, arrays, grad_outputs):
        """The output gradient's tensor rewritten in place by torch.add (`_add_tiled`; the
        offsets times their signs by NumPy, `signed`), then torch.autograd.grad on the graph
        recorded once, as `backward_call`."""
        import torch

        from d500.backends.torch.dtypes import from_numpy
        from d500.operators.adapters import Buffers, first_grad, float_grads, signed
        if first_grad(grad_outputs) is None:
            return None
        mine = [None if g is None else np.array(g, copy=True) for g in grad_outputs]
        inputs, _, pairs = self._graph(arrays, mine)  # its tensors may share `mine`'s memory
        wrt = [t for t in inputs if t.requires_grad]
        if not pairs or not wrt:
            return None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        first, out = grads[0].clone().reshape(-1), grads[0].view(-1)  # first_grad's pair
        buffers = Buffers()

        def backward(offsets, signs=None):
            _add_tiled(first, from_numpy(signed(offsets, signs, buffers)), out)
            return float_grads(torch.autograd.grad(outs, wrt, grads, retain_graph=True,
                                                   allow_unused=True), arrays)
        return backward

    def checksums(self, weights, signs=None):
        """torch.dot in torch's own threads on a float output (NumPy's einsum otherwise): no
        conversion to NumPy, no second thread pool; the weights turned by a view (a
        backward's times their signs' window by NumPy, `flipped`, into a buffer torch
        shares)."""
        import torch

        from d500.operators.adapters import Buffers, flipped, turned
        on_numpy = super().checksums(weights, signs)
        native = [torch.from_numpy(w) for w in weights]
        buffers = Buffers()

        def sums(outputs, turn=0, flip=None):
            if not all(isinstance(y, torch.Tensor) and y.is_floating_point() for y in outputs):
                return on_numpy(outputs, turn, flip)
            out = []
            for k, (w, y) in enumerate(zip(native, outputs)):
                start, n = turned(w.numel(), y.numel(), turn), y.numel()
                w = w[start:start + n]
                if signs is not None and flip is not None:
                    given = weights[k][start:start + n]
                    w = torch.from_numpy(flipped(given, signs[k], flip, buffers(k, given)))
                out.append(torch.dot(w, y.reshape(-1).to(torch.float32)).item())
            return out
        return sums

    def _graph(self, arrays, grad_outputs):
        """Inputs (float ones requiring grad), outputs recorded by autograd, and the pairs of
        differentiable outputs and their output gradients."""
        import torch

        from d500.backends.torch.dtypes import from_numpy
        inputs = self.to_native(arrays)
        for t in inputs:
            if t.is_floating_point():
                t.requires_grad_(True)
        fn = as_torch_function(self.op) if self.own_backward else self.op.forward
        with torch.enable_grad():
            outputs = as_tuple(fn(*inputs))
        pairs = [(o, from_numpy(np.asarray(g)).to(o.dtype))
                 for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
        return inputs, outputs, pairs

    def gradients(self, arrays, grad_outputs):
        import torch
        inputs, outputs, pairs = self._graph(arrays, grad_outputs)
        wrt = [t for t in inputs if t.requires_grad]
        grads = (torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                     allow_unused=True) if pairs and wrt else [None] * len(wrt))
        it = iter(grads)
        out = [next(it) if t.requires_grad else None for t in inputs]
        return ([self._numpy(o) for o in outputs],
                [None if g is None else self._numpy(g) for g in out])

    def backward_call(self, arrays, grad_outputs):
        import torch
        inputs, _, pairs = self._graph(arrays, grad_outputs)
        wrt = [t for t in inputs if t.requires_grad]
        if not pairs or not wrt:
            return None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        return lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)


def _add_tiled(first: Any, offsets: Any, out: Any) -> None:
    """out = first + offsets tiled, 1-D tensors (d500.operators.adapters.add_tiled in torch)."""
    import torch
    n, period = first.numel(), offsets.numel()
    q = n // period * period
    torch.add(first[:q].view(-1, period), offsets, out=out[:q].view(-1, period))
    torch.add(first[q:], offsets[:n - q], out=out[q:])


def as_torch_function(op: CustomOperator) -> Callable[..., Any]:
    """The operator as a torch.autograd.Function whose backward is the operator's backward."""
    import torch

    class OperatorFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            outputs = op.forward(*inputs)
            many = isinstance(outputs, (tuple, list))
            outs = as_tuple(outputs)
            ctx.save_for_backward(*inputs, *outs)
            ctx.n_inputs = len(inputs)
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            return tuple(outs) if many else outs[0]

        @staticmethod
        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            inputs, outputs = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
            from d500.backends.torch.dtypes import from_numpy
            result = pad_any(as_tuple(op.backward(grads, inputs, outputs)), ctx.n_inputs)
            return tuple(None if g is None else g if isinstance(g, torch.Tensor)
                         else from_numpy(np.asarray(g)) for g in result)

    OperatorFunction.__name__ = f"{type(op).__name__}Function"
    return OperatorFunction.apply


def backward(mode: str, exe: Any, case: Any, inputs: Sequence[np.ndarray],
             seeds: dict[str, np.ndarray], wrt: list[str]) -> BackwardCall | None:
    """torch.autograd.grad on the outputs of the translated module (`Executable.native`), the
    graph recorded once and retained; None in another mode than eager (as before the hooks,
    only eager's backward is timed here)."""
    if mode:
        return None
    import torch

    from d500.backends.torch.dtypes import from_numpy
    feeds = {}
    for n, x in zip(exe.input_names, inputs):
        t = from_numpy(np.array(x, copy=True))
        feeds[n] = t.requires_grad_(True) if n in wrt else t
    with torch.enable_grad():
        outs = exe.native(**feeds)
    by_name = dict(zip(exe.output_names, outs))
    ys = [by_name[n] for n in seeds]
    gs = [from_numpy(np.asarray(g)).to(by_name[n].dtype) for n, g in seeds.items()]
    xs = [feeds[n] for n in wrt]
    return BackwardCall(lambda: torch.autograd.grad(ys, xs, gs, retain_graph=True,
                                                    allow_unused=True),
                        method="torch.autograd.grad on the translated module, graph retained")
