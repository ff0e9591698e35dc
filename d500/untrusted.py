"""Reading what a process that runs an entry's code sends: a pickle that may build plain values,
NumPy arrays and the d500 records named here, and call nothing else.

    message = receive(conn)    # in place of conn.recv(); Forbidden naming what was refused
    value = loads(data)        # the same, of bytes

A plain `recv()` unpickles whatever the sender wrote, and a pickle can call any function it
names (`exec`, `os.system`): an entry's worker, operator host or level-3 rank 0 could then run
its code in the judge's process, beside the official clock and the held-out data. Every pipe
from such a process to the judge is read through here.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from d500.errors import D500Error

ALLOWED = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),  # arrays and NumPy scalars, as NumPy pickles them
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
    ("builtins", "complex"), ("builtins", "bytearray"), ("builtins", "set"),
    ("builtins", "frozenset"),
    ("ml_dtypes", "bfloat16"),  # a bf16 array's dtype (a bf16 operator's output)
    ("d500.distributed.figures", "RankStats"),  # a level-3 rank's measurements (a dataclass)
})


class Forbidden(D500Error):
    """A message that is not a pickle of plain values and arrays."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise Forbidden(f"sent an object d500 does not accept ({module}.{name}): a "
                            f"message may hold only numbers, text, containers and arrays")
        return super().find_class(module, name)


def loads(data: bytes | memoryview) -> Any:
    """The value a message's bytes hold, refusing anything but ALLOWED's globals."""
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except Forbidden:
        raise
    except Exception as err:  # noqa: BLE001 - any malformed pickle, as one line
        raise Forbidden(f"sent a message that is not a pickle d500 reads "
                        f"({type(err).__name__})") from None


def receive(conn: Any) -> Any:
    """conn.recv(), read through `loads` (EOFError and OSError as recv raises them)."""
    return loads(conn.recv_bytes())
