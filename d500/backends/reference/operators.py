"""The reference's part of level 0: how its backward of one operator case is timed (`backward`:
the NumPy VJP of the node). A NumPy operator runs through d500.operators.adapters.Runner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from d500.operators.backward import FORWARD_AND_BACKWARD, BackwardCall


def backward(mode: str, exe: Any, case: Any, inputs: Sequence[np.ndarray],
             seeds: dict[str, np.ndarray], wrt: list[str]) -> BackwardCall:
    """The NumPy VJP of the node (the reference's table) on the forward's values; an operator
    the table differentiates through its ONNX function expansion (LayerNormalization) is timed
    as `Executable.gradients` (forward and backward), and the benchmark subtracts the forward's
    median."""
    from d500.backends.reference.executable import VJP
    from d500.backends.reference.table import Step, attributes
    from d500.operators.reference import DEFAULT_OPSET
    node = exe.model.graph.node[0]
    vjp = VJP.get(node.op_type)
    feeds = list(inputs)
    if vjp is None:
        return BackwardCall(lambda: exe.gradients(feeds, grad_outputs=seeds, wrt=wrt),
                            FORWARD_AND_BACKWARD,
                            f"Executable.gradients (the reference differentiates {node.op_type} "
                            f"through its function expansion) minus the forward")
    outputs = exe.run(feeds)
    step = Step(node, case.opset or DEFAULT_OPSET, feeds, outputs, attributes(node))
    g = [seeds.get(n) for n in exe.output_names]
    return BackwardCall(lambda: vjp(step, g), method="the NumPy VJP of the node")
