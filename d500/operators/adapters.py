"""Run any CustomOperator on NumPy arrays: forward, gradients, and its native forward and backward
calls for timing.

A framework's operators run through the Runner its FRAMEWORK names (`operator_runner`, in
`d500/backends/<framework>/operators.py`; NumPy's is the Runner here): torch/tensorflow/jax
operators with their own `backward` are wrapped as a torch.autograd.Function /
tf.custom_gradient / jax.custom_vjp there, so the framework calls the backward exactly as it
would inside a model. bfloat16 arrays (ml_dtypes)
become torch.bfloat16 tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from d500.operators.base import CustomOperator


def as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class Runner:
    """An operator instance seen through NumPy."""

    def __init__(self, op: CustomOperator):
        self.op = op
        self.own_backward = type(op).has_backward()

    @property
    def has_gradients(self) -> bool:
        return self.own_backward

    def to_native(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        return [np.array(a, copy=True, order="C") for a in arrays]  # the operator may write

    def call(self, native: Sequence[Any]) -> Any:
        """The operator's forward on native inputs (what the benchmark times)."""
        return self.op.forward(*native)

    def forward(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(self._numpy(o)) for o in as_tuple(self.call(self.to_native(arrays)))]

    def gradients(self, arrays: Sequence[np.ndarray], grad_outputs: Sequence[np.ndarray | None]
                  ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        inputs = tuple(self.to_native(arrays))
        outputs = as_tuple(self.op.forward(*inputs))
        grads = as_tuple(self.op.backward(tuple(grad_outputs), inputs, outputs))
        return [np.asarray(o) for o in outputs], _pad(grads, len(arrays))

    def timed_forward(self, arrays: Sequence[np.ndarray]) -> Callable[[], Any]:
        """The call the benchmark times: the forward on inputs converted once."""
        native = self.to_native(arrays)
        return lambda: self.call(native)

    def timed_backward(self, arrays: Sequence[np.ndarray],
                       grad_outputs: Sequence[np.ndarray | None]) -> Callable[[], Any] | None:
        return self.backward_call(arrays, grad_outputs)

    def backward_call(self, arrays: Sequence[np.ndarray],
                      grad_outputs: Sequence[np.ndarray | None]) -> Callable[[], Any] | None:
        """The operator's backward alone (forward done once beforehand), for timing; None when
        it has none."""
        if not self.own_backward:
            return None
        inputs = tuple(self.to_native(arrays))
        outputs = as_tuple(self.op.forward(*inputs))
        grads = tuple(grad_outputs)
        return lambda: self.op.backward(grads, inputs, outputs)

    def shifted(self, arrays: Sequence[np.ndarray], second: int | None = None
                ) -> Callable[..., list[Any]]:
        """For checked timing (d500.operators.host): a function from a call's offsets (an array
        of the first array's dtype, as long as it: a window of the judge's pattern), and those
        of array `second` if given, to the native inputs, each shifted array being the given
        one plus its offsets (`add_tiled`, which also tiles shorter offsets over its
        elements). Converted once; a shifted input rewritten in place where its native array
        shares NumPy's memory (NumPy, torch), converted anew each call otherwise (`_adder`)."""
        native = self.to_native(arrays)
        first = self._adder(arrays, native, 0)
        other = None if second is None else self._adder(arrays, native, second)

        def shift(offsets: np.ndarray, more: np.ndarray | None = None) -> list[Any]:
            first(offsets)
            if other is not None and more is not None:
                other(more)
            return native
        return shift

    def _adder(self, arrays: Sequence[np.ndarray], native: list[Any], k: int
               ) -> Callable[[np.ndarray], None]:
        """Sets native[k] to arrays[k] plus a call's offsets (`shifted`)."""
        view = writable_view(native[k])
        given = np.ascontiguousarray(arrays[k]).reshape(-1)
        flat = view.reshape(-1) if view is not None and view.flags.c_contiguous else None

        def add(offsets: np.ndarray) -> None:
            if flat is not None:
                add_tiled(given, offsets, flat)
            else:
                out = add_tiled(given, offsets, np.empty_like(given))
                native[k] = self.to_native([out.reshape(np.shape(arrays[k]))])[0]
        return add

    def shifted_backward(self, arrays: Sequence[np.ndarray],
                         grad_outputs: Sequence[np.ndarray | None]
                         ) -> Callable[[np.ndarray], list[Any]] | None:
        """For checked timing of the backward (d500.operators.host): a function from a call's
        offsets (and `signs`, a window of +1 and -1 as long, which multiply them: `signed`) to
        its float inputs' gradients (`float_grads`), the output gradient `first_grad` names
        being the given one plus the offsets tiled (`add_tiled`); None without a backward.
        Here rewritten in place in the NumPy array the operator's backward reads; a framework
        that converts it (torch, JAX, TensorFlow) overrides this."""
        k = first_grad(grad_outputs)
        if k is None:
            return None
        grads = [None if g is None else np.array(g, copy=True, order="C") for g in grad_outputs]
        call = self.timed_backward(arrays, grads)
        if call is None:
            return None
        flat = grads[k].reshape(-1)
        first, buffers = flat.copy(), Buffers()

        def backward(offsets: np.ndarray, signs: np.ndarray | None = None) -> list[Any]:
            add_tiled(first, signed(offsets, signs, buffers), flat)
            return float_grads(call(), arrays)
        return backward

    def checksums(self, weights: Sequence[np.ndarray], signs: Sequence[np.ndarray] | None = None
                  ) -> Callable[..., list[float]]:
        """For checked timing: a function from one call's native outputs and its turn to their
        checksums, each output's elements dotted in float32 with its float32 `weights` turned
        (`turned`: given twice over, a slice); with `signs` (a backward's, one pattern of +1
        and -1 per output, d500.operators.host._weight_signs), the function also takes the
        call's flip, and the turned weights are first multiplied by the window of the signs
        there (`flipped`, into a buffer). Here by einsum's own loop on the outputs as NumPy
        (`weighed`, in each output's memory order): a BLAS dot's threads would contend with
        another framework's thread pool (torch's OpenMP threads made it 9x slower on 2
        cores)."""
        buffers = Buffers()

        def sums(outputs: Sequence[Any], turn: int = 0, flip: int | None = None
                 ) -> list[float]:
            out = []
            for k, (w, y) in enumerate(zip(weights, outputs)):
                y = as32(self._numpy(y))
                start = turned(w.size, y.size, turn)
                w = w[start:start + y.size]
                if signs is not None and flip is not None:
                    w = flipped(w, signs[k], flip, buffers(k, w))
                out.append(weighed(w, y))
            return out
        return sums

    def _numpy(self, value: Any) -> Any:
        return value


ALIGN = 16  # a call's weights start at a multiple of this many elements (`turned`)


def turned(weights: int, size: int, turn: int) -> int:
    """Where a call's weights of an output of `size` elements start in all its weights
    (`weights` of them: M at least `size`, twice over, d500.operators.host._weights), for its
    turn t: at t mod M, rounded down to a multiple of ALIGN (torch.dot on float32 weights that
    start off a 16-byte boundary took 5-9x as long); at 0 with weights of the output's size
    (turn 0)."""
    half = weights // 2
    return int(turn) % half // ALIGN * ALIGN if size and half >= size else 0


def signed(offsets: np.ndarray, signs: np.ndarray | None, buffers: Buffers) -> np.ndarray:
    """A backward call's offsets times its window of signs (+1 and -1, as many: at most
    d500.operators.host.PATTERN numbers, then tiled as the offsets are), into a buffer of
    `buffers`; the offsets themselves without signs."""
    return offsets if signs is None else np.multiply(offsets, signs, out=buffers(0, offsets))


def flipped(w: np.ndarray, signs: np.ndarray, flip: int, out: np.ndarray | None = None
            ) -> np.ndarray:
    """A backward call's weights: its turned weights `w` times the window of `signs` (+1 and -1,
    given twice over) at its flip, taken mod their length (never aligned: the pairs of starts
    of the two windows are too many to tabulate, d500.operators.host._signs)."""
    start = int(flip) % (signs.size // 2)
    return np.multiply(w, signs[start:start + w.size], out=out)


class Buffers:
    """One reusable array per output, shaped and typed as the first array given for it."""

    def __init__(self) -> None:
        self.kept: dict[int, np.ndarray] = {}

    def __call__(self, k: int, like: np.ndarray) -> np.ndarray:
        got = self.kept.get(k)
        if got is None or got.shape != like.shape or got.dtype != like.dtype:
            got = self.kept[k] = np.empty_like(like)
        return got


def add_tiled(flat: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = flat + offsets tiled (element j gets offsets[j % len(offsets)]), 1-D arrays; one
    pass (the judge's offsets are as long as flat: a plain add)."""
    n, period = flat.size, offsets.size
    q = n // period * period
    np.add(flat[:q].reshape(-1, period), offsets, out=out[:q].reshape(-1, period))
    np.add(flat[q:], offsets[:n - q], out=out[q:])
    return out


def second_float(arrays: Sequence[Any]) -> int | None:
    """The input a checked forward at level 0 shifts besides the first: the first float one
    after it, not empty (d500.operators.host: a MatMul's B, a Conv's W)."""
    from d500.operators.dtypes import is_float
    return next((k for k, a in enumerate(arrays) if k and np.size(a)
                 and is_float(np.asarray(a).dtype)), None)


def first_grad(grad_outputs: Sequence[Any]) -> int | None:
    """The output gradient a checked backward shifts: the first float one given."""
    from d500.operators.dtypes import is_float
    return next((k for k, g in enumerate(grad_outputs)
                 if g is not None and is_float(np.asarray(g).dtype)), None)


def float_grads(result: Any, arrays: Sequence[np.ndarray]) -> list[Any]:
    """A backward's result as one gradient per float input, in order (NumPy zeros for one it
    left out): a Runner's backward gives one per input or one per float input."""
    from d500.operators.dtypes import is_float
    floats = [is_float(np.asarray(a).dtype) for a in arrays]
    got = list(as_tuple(result))
    if len(got) != sum(floats):
        got = [g for g, f in zip(pad_any(got, len(arrays)), floats) if f]
    kept = [a for a, f in zip(arrays, floats) if f]
    return [np.zeros(np.shape(a), np.asarray(a).dtype) if g is None else g
            for g, a in zip(got, kept)]


def as32(y: Any) -> np.ndarray:
    """An array as a float32 NumPy array, its memory order kept (no copy if float32)."""
    y = np.asarray(y)
    return y if y.dtype == np.float32 else y.astype(np.float32)


AXES = "abcdefghijklmnopqrstuvwxyz"  # einsum's letters (`weighed`)
TILE = 64  # the elements of an output's fastest axis a checksum's einsum takes at a time


def weighed(w: np.ndarray, y: np.ndarray) -> float:
    """The checksum sum_j w_j y_j, y's elements taken in C order (as the judge ravels the
    reference's outputs), w flat and as many: einsum's float32 loop over y in its own memory
    order, w viewed in y's shape, so that an array not in C order is not copied to it (the
    reference's Gemm weight gradients are transposed views; README, level 1). Both are seen
    with their axes in y's memory order where that makes y C-contiguous (einsum then reads y
    in one pass), in slabs of TILE along y's fastest axis (the weights, read across, then
    touch TILE pages at a time, not one per element of a row; README, level 1)."""
    if y.flags.c_contiguous or y.ndim > len(AXES):
        return float(np.einsum("i,i->", w, y.reshape(-1)))
    axes, by = AXES[:y.ndim], w.reshape(y.shape)
    if min(y.strides) >= 0:
        order = sorted(range(y.ndim), key=lambda k: -y.strides[k])
        if y.transpose(order).flags.c_contiguous:
            by, y = by.transpose(order), y.transpose(order)
    spec = f"{axes},{axes}->"
    return sum(float(np.einsum(spec, by[..., k:k + TILE], y[..., k:k + TILE]))
               for k in range(0, max(y.shape[-1], 1), TILE))


def writable_view(native: Any) -> np.ndarray | None:
    """A NumPy array sharing `native`'s memory, or None (a framework's tensor that copies)."""
    try:
        a, b = np.asarray(native), np.asarray(native)
    except Exception:  # noqa: BLE001 - e.g. a bfloat16 torch tensor
        return None
    return a if a.flags.writeable and np.shares_memory(a, b) else None


def _pad(grads: Sequence[Any], n: int) -> list[Any]:
    grads = list(grads)[:n]
    return [None if g is None else np.asarray(g) for g in grads] + [None] * (n - len(grads))


def pad_any(grads: Sequence[Any], n: int) -> list[Any]:
    """`grads` cut or padded with None to one entry per input, entries kept as they are."""
    grads = list(grads)[:n]
    return grads + [None] * (n - len(grads))


def runner(op: CustomOperator) -> Runner:
    """The Runner for an operator instance's framework (an operator in a host process,
    d500.operators.host, brings its own)."""
    if hasattr(op, "runner"):
        return op.runner()
    from d500.backends import by_module
    fw = by_module(op.framework)
    found = None if fw is None else fw.hook(fw.operator_runner)  # in the framework's folder
    return (found or Runner)(op)
