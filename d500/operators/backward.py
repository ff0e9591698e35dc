"""The backward pass alone, as a call to time: a backend's own gradient of one operator case, given
its forward's saved state, the way each framework runs it inside a model. Each framework's call
is the `backward` hook its FRAMEWORK names (`d500/backends/<framework>/operators.py`, which says
how it runs): torch (eager), tensorflow (graph), jax (both modes) and the reference have one;
onnxruntime and OpenVINO, inference only, none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from d500.operators.dtypes import is_float

FORWARD_AND_BACKWARD = "forward+backward"  # a call that also runs the forward


@dataclass
class BackwardCall:
    """A call that runs one backward pass, and what it includes."""

    call: Callable[[], Any]
    includes: str = "backward"  # or FORWARD_AND_BACKWARD
    method: str = ""            # how the backend runs it, for the record


def builtin_backward(name: str, exe: Any, case: Any, inputs: Sequence[np.ndarray],
                     grad_outputs: Sequence[np.ndarray | None]) -> BackwardCall | None:
    """A backend's own backward for the one-node model `exe` runs; None when the backend has
    none (onnxruntime, an operator without a gradient). Raises what the backend raises."""
    seeds = {exe.output_names[k]: g for k, g in enumerate(grad_outputs)
             if g is not None and k < len(exe.output_names)}
    wrt = [n for n, x in zip(exe.input_names, inputs) if is_float(np.asarray(x).dtype)]
    if not seeds or not wrt:
        return None
    from d500 import backends
    fw = backends.about(name)
    hook = None if fw is None else fw.hook(fw.backward)  # in the framework's folder
    return None if hook is None else hook(backends.split(name)[1], exe, case, inputs, seeds, wrt)
