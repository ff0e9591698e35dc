"""Reading what a process that runs an entry's code sends: a pickle that may build plain values,
NumPy arrays and the d500 records named here, and call nothing else.

    message = receive(conn)    # in place of conn.recv(); Forbidden naming what was refused
    value = loads(data)        # the same, of bytes
    value = json_value(text)   # JSON a sender wrote (a package, an MLLOG): ValueError when not
                               # JSON or nested deeper than MAX_DEPTH

A plain `recv()` unpickles whatever the sender wrote, and a pickle can call any function it
names (`exec`, `os.system`): an entry's worker, operator host or level-3 rank 0 could then run
its code in the judge's process, beside the official clock and the held-out data. Every pipe
from such a process to the judge is read through here.

JSON a sender wrote is read through `json_value`: Python's parser, and every function walking
what it returns, recurse once per level, so `[[[...]]]` 200,000 deep (400 kB) ended `d500 check`
and `d500 ledger import` in a RecursionError's traceback, and 500 deep in a run's hyperparameters
(parsed, then written out again) did too.
"""

from __future__ import annotations

import io
import json
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
MAX_DEPTH = 64  # containers within containers in a sender's JSON (d500's own: 5 at most)


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


def json_value(text: str | bytes) -> Any:
    """json.loads of a sender's text; a ValueError (json.JSONDecodeError when it is not JSON)
    when it is not, or holds containers nested deeper than MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH}") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:  # no recursion: the depth of each container, breadth by breadth
        found, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH}")
        items = found.values() if isinstance(found, dict) else found
        stack += [(x, depth + 1) for x in items if isinstance(x, (dict, list))]
    return value
