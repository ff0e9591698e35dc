"""glibc's heap set alike in the judge and in the processes that run an entry's code."""

from __future__ import annotations

import ctypes

MMAP_MAX, TRIM = 32 << 20, 64 << 20  # the mmap and trim thresholds (`allocator`)


def allocator() -> None:
    """glibc's heap set alike in the judge (before it times a row) and in each host (before the
    entry's code loads): temporaries up to MMAP_MAX on the heap (glibc's own ceiling for its
    dynamic threshold), the heap trimmed past TRIM. Left to glibc, a young host trimmed its heap
    and mmapped its temporaries anew each call, while the judge, older, had raised its threshold:
    level 1's mlp-mnist step at batch 64 took a host 1.8x the judge's time, a batch-32 resnet20
    pass the judge 1.3x the host's (benchmarks/hosted_backend.py); level 0's im2col Conv 1x1
    3.3x (benchmarks/isolation.py --case operators; README)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, MMAP_MAX)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, TRIM)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def mmapped(size: int) -> bool | None:
    """Whether glibc serves a request of `size` bytes with mmap in this process (its mmap
    threshold read back by what it does; glibc has no getter): mallinfo2's mmapped bytes
    before and while the block is held. None: not glibc 2.33 or later."""
    try:
        libc = ctypes.CDLL(None)
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype = _Mallinfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = info().hblkhd
    block = libc.malloc(size)
    try:
        return info().hblkhd > before
    finally:
        libc.free(block)


def probe() -> tuple[bool | None, bool | None]:
    """Whether a block of 3/4 MMAP_MAX, then one of 5/4 MMAP_MAX, is mmapped here: (False, True)
    once `allocator` ran; a fresh process's glibc mmaps both. Meaningful in a young process only:
    an old one may serve either block from a free chunk it holds, whatever its thresholds."""
    return mmapped(MMAP_MAX * 3 // 4), mmapped(MMAP_MAX * 5 // 4)
