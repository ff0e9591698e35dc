"""D500Error and its children: every failure a user can cause, printed by the CLI as one line;
`describe` turns any exception a run caught into the one line a report or ledger row keeps."""

from __future__ import annotations

import traceback
from pathlib import Path


def did_you_mean(name: str, choices) -> str:
    """"did you mean 'X'?" for the choice closest to a mistyped name (difflib's default cutoff,
    case aside: 'rleu' is near 'Relu'), or "" when none is close: the hint every unknown-name
    error shares."""
    from difflib import get_close_matches
    by_lower = {str(c).lower(): str(c) for c in reversed(list(choices))}  # the first spelling
    near = get_close_matches(str(name).lower(), list(by_lower), n=1)
    return f"did you mean '{by_lower[near[0]]}'?" if near else ""


def listed(name: str, choices) -> str:
    """The choices, comma-separated, and the hint for a mistyped `name` when one is close: what
    the parentheses of an unknown-name error hold ("known: a, b; did you mean 'b'?")."""
    hint = did_you_mean(name, choices)
    return ", ".join(map(str, choices)) + (f"; {hint}" if hint else "")


class D500Error(Exception):
    """A failure the user can act on; the CLI prints it as one line and exits with `exit_code`."""

    exit_code = 2


class UsageError(D500Error):
    """Bad command-line usage or an unknown name (backend, metric, workload)."""


class ModelError(D500Error):
    """An ONNX file or ModelProto that cannot be loaded or checked."""


class UnsupportedOperator(D500Error):
    """A backend lacks an operator; the message names op type, domain, opset, node and backend."""

    def __init__(self, op_type: str, domain: str, opset: int, node: str, backend: str,
                 why: str = ""):
        self.op_type, self.domain, self.opset, self.node, self.backend = (
            op_type, domain or "ai.onnx", opset, node, backend)
        extra = f": {why}" if why else ""
        super().__init__(
            f"backend '{backend}' does not support operator {self.domain}::{op_type} "
            f"(opset {opset}) used by node '{node or '<unnamed>'}'{extra}")


class ConfigError(D500Error):
    """A bad YAML workload or submission file; the message names the file and field."""


class DatasetError(D500Error):
    """A missing or malformed dataset."""


class CheckFailed(D500Error):
    """A check ran and failed: an operator or network disagrees with the reference, a rule broke."""

    exit_code = 1


class Diverged(D500Error):
    """A training run diverged (NaN/Inf loss)."""

    exit_code = 1


def describe(err: BaseException) -> str:
    """One line for an exception a run caught and records: a D500Error's own message (it already
    names the file, node or field); anything else its type, message and the innermost frame, so a
    crash in a backend or a submission's code can be found without a traceback."""
    if isinstance(err, D500Error):
        return str(err)
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}{where}" if text else f"{type(err).__name__}{where}"
