"""D500Error and its children: every failure a user can cause, printed by the CLI as one line."""

from __future__ import annotations


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
