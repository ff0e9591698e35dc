"""A call's checksum is read in its output's own memory order (adapters.weighed) and is still the
judge's: the dot with the weights in C order, whatever the output's layout."""

import numpy as np
import pytest

from d500.operators.adapters import Runner
from d500.operators.host import _agrees, _expected, _turned, _weights

RNG = np.random.default_rng(7)


def _layouts() -> list[tuple[str, np.ndarray]]:
    a = RNG.standard_normal((300, 70), dtype=np.float32)
    b = RNG.standard_normal((6, 40, 50), dtype=np.float32)
    wide = RNG.standard_normal((130, 1000), dtype=np.float32)
    return [("transposed", a.T),  # a Gemm weight gradient of the reference
            ("transposed, dotted in slabs", wide.T),
            ("permuted 3-D", b.transpose(2, 0, 1)),
            ("strided slice", a[::2, 5:]),
            ("reversed", a[::-1]),
            ("float64 in Fortran order", np.asfortranarray(a.astype(np.float64))),
            ("C order", a)]


@pytest.mark.parametrize("name,y", _layouts(), ids=[n for n, _ in _layouts()])
def test_any_layout_gives_the_judges_checksum(name: str, y: np.ndarray) -> None:
    weights = _weights(12345, [y])
    sums = Runner.__new__(Runner).checksums(weights)
    for turn in (0, 977, 70_001):
        got = sums([y], turn)[0]
        want, bound = _expected(_turned(weights[0], turn, y.size), np.ascontiguousarray(y),
                                0.0, 0.0)
        assert _agrees(got, want, bound), (name, turn, got, want, bound)
        # the same memory dotted in its own order without the weights laid out alike is not it
        if not y.flags.c_contiguous and y.ndim == 2 and y.flags.f_contiguous:
            wrong = float(np.dot(_turned(weights[0], turn, y.size).astype(np.float64),
                                 y.ravel(order="F").astype(np.float64)))
            assert not _agrees(wrong, want, bound), name


def test_a_transposed_output_is_not_copied() -> None:
    """The checksum of a transposed view allocates no copy of it (tracemalloc sees no block of
    its size), which is what it saves."""
    import tracemalloc
    y = RNG.standard_normal((784, 128), dtype=np.float32).T
    sums = Runner.__new__(Runner).checksums(_weights(3, [y]))
    sums([y], 5)
    tracemalloc.start()
    try:
        sums([y], 6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < y.nbytes // 4, peak
