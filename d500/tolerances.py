"""How close a result must be to its reference, by dtype: the one home of d500's tolerances.

Every tolerance sits between two kinds of difference: what correct code costs at that precision
(another summation order, a blocked GEMM, Winograd or FFT convolution, a fused kernel) and what a
real bug shows (a wrong padding, a swapped axis, a missing bias or element). Integers and
booleans are always compared exactly.

Operators (level 0, `d500.operators.validate`), against the ONNX reference run in float64 on the
same dtype-rounded inputs:
- forward (`FORWARD_TOL`, dtype -> (rtol, atol_frac)): element-wise, |got - want| <= atol +
  rtol·|want| with atol = atol_frac · max|want| (the output's scale). The rtol term is the real
  test; the atol term keeps an element near a zero crossing, where cancellation leaves only
  rounding noise of the size of its neighbours, from failing a relative test it cannot meet. A
  dtype the table lacks is judged as float32.
- gradients (`GRADIENT_TOL`, the dtype the backward ran in -> rtol): the error of a directional
  derivative <backward(g), v> against the central finite difference (L(x+hv) - L(x-hv)) / 2h of
  the float64 reference, relative to the derivatives' RMS over the directions; a check passes
  when |error| <= rtol · RMS + a generous bound on the loss's rounding (64 eps sum|y g|, which
  only counts where huge edge values make the loss large against the step). In float64 the
  finite difference itself is the limit (truncation grows with h², rounding with eps/h), hence
  1e-6 rather than less; in float32 and float16 the backward pass's
  own rounding dominates. A dtype the table lacks gets 1e-3. The backward runs in float64
  whenever the operator accepts float64 inputs (so even a float16 or bfloat16 operator's
  backward is usually held to 1e-6); the dtype's own tolerance applies only to an operator that
  runs in that dtype alone.

Half precision (level 0). The reference runs in float64 on the inputs as rounded to the case's
dtype, so input rounding never counts; what remains is the operator's own rounding. With
u = 2^-(p+1) the unit roundoff (p the stored significand bits: float16 u = 2^-11 = 4.9e-4,
bfloat16 u = 2^-8 = 3.9e-3), a kernel that accumulates in float32 and rounds its result once
errs by u relative to each element; rounding a few intermediates in the dtype (BatchNorm's
(x - mean) / sqrt(var + eps) * scale + bias) costs a few u relative to the output's scale.
Measured on every level-0 case with torch's CPU kernels (`tests/operators/test_bf16.py` runs
them): the largest error relative to (|y| + max|y|) is 1.5u for float16 and 1.3u for bfloat16
(BatchNorm), 1.1u..0.3u elsewhere; with rtol 8u, the bfloat16 elements need an atol of at most
0.5u of the output's scale.
- float16 forward (1e-2, 1e-2), about 20u: the table's value from before bfloat16.
- bfloat16 forward: rtol 2^-5 = 3.1e-2 = 8u, six times the worst correct kernel measured, room
  for an implementation that rounds several intermediates in bfloat16; atol 2^-6 = 1.6e-2 = 4u
  of the output's scale, for elements near a zero crossing. Below a real bug's size (a wrong
  pad, a missing bias, a swapped axis err by O(1) of the output's scale), and above float8's
  rounding (2^-4), which fails. An operator that accumulates long sums in bfloat16 itself (error
  about sqrt(K) u for K terms) fails from K ~ 64, as it should: training kernels accumulate in
  float32.
- gradients computed in float16: 5e-2; in bfloat16: 2^-3 = 0.125 = 32u. A backward that runs
  in bfloat16 alone rounds reductions over the batch in bfloat16 (torch's CPU LayerNorm bias
  gradient over 512 rows errs by 7.8e-2, Pow's near x = 0 by 9.6e-2), so its directional error
  is judged against 1/8; a wrong formula errs by O(1).

The ONNX node tests (`d500.conformance`) keep each test's own element-wise (rtol, atol), as
`onnx.backend.test.BackendTest` judges; a mode that computes float32 in a lower dtype
(openvino:bf16) gets the looser of those and that dtype's operator forward tolerance above
(`node_test`), its atol taken of the expected output's scale: a node test is one operator.

Networks (level 1, `d500.networks.compare`, `NETWORK_RTOL`): an output agrees when max|a - b| <=
rtol · max|b| over its finite elements, with NaN and ±inf in the same places. The error is taken
relative to the output's *scale* (its largest magnitude), not element by element: backends
legitimately sum in different orders and with different algorithms, so an element near a zero
crossing can carry an error of the size of its neighbours' rounding and an element-wise relative
error there means nothing. For float32, a dot product of length K has a rounding error bound of
about K·eps·Σ|terms|; through a network of tens of layers with K up to a few thousand the
observed differences between correct backends are 1e-6..1e-4 of the output scale, while real bugs
show up at 1e-2 or more. rtol 1e-3 for float32 sits between the two and is the tolerance ONNX's
own model tests use for these networks; float64 gets 1e-9, half precision 2e-2; a dtype the table
lacks gets 1e-3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# level 0 forward: dtype -> (rtol, atol as a fraction of the output's scale = max |reference|)
FORWARD_TOL = {"float64": (1e-9, 1e-11), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2),
               "bfloat16": (2.0 ** -5, 2.0 ** -6)}
# level 0 gradients: dtype the gradient is computed in -> relative tolerance of a directional
# derivative
GRADIENT_TOL = {"float64": 1e-6, "float32": 1e-3, "float16": 5e-2, "bfloat16": 2.0 ** -3}
# level 1: output dtype -> tolerance relative to the output's scale
NETWORK_RTOL = {"float64": 1e-9, "float32": 1e-3, "float16": 2e-2, "bfloat16": 2e-2}
DEFAULT_NETWORK_RTOL = 1e-3


def _exact(dtype: np.dtype) -> bool:
    return dtype.kind in "iub"


def operator_forward(dtype: Any) -> tuple[float, float]:
    """(rtol, atol_frac) for an operator's outputs of `dtype`; (0, 0) for integers: exact."""
    dtype = np.dtype(dtype)
    if _exact(dtype):
        return 0.0, 0.0
    return FORWARD_TOL.get(dtype.name, FORWARD_TOL["float32"])  # bfloat16's name: "bfloat16"


def operator_gradient(dtype: Any) -> float:
    """The relative tolerance of a directional derivative computed in `dtype`."""
    return GRADIENT_TOL.get(np.dtype(dtype).name, 1e-3)


def network(dtype: Any) -> float:
    """The tolerance for network outputs of `dtype`, relative to the output's scale (0 for
    integers and booleans: exact)."""
    dtype = np.dtype(dtype)
    if _exact(dtype):
        return 0.0
    return NETWORK_RTOL.get(dtype.name, DEFAULT_NETWORK_RTOL)


def node_test(rtol: float, atol: float, want: Any, precision: str | None) -> tuple[float, float]:
    """(rtol, atol) for a node test's expected float output `want` from a mode that computes in
    `precision` (None: the test's own rtol and atol)."""
    want = np.asarray(want)
    if precision is None or want.dtype.kind not in "fc" or not want.size:
        return rtol, atol
    low_rtol, atol_frac = FORWARD_TOL[precision]
    finite = np.abs(want[np.isfinite(want)])
    scale = float(finite.max()) if finite.size else 0.0
    return max(rtol, low_rtol), max(atol, atol_frac * scale)
