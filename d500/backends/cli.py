"""`d500 backends`: every backend mode (a framework and a mode: `onnxruntime`,
`onnxruntime:basic`), whether its framework is installed, and what the mode is."""

from __future__ import annotations

from d500 import backends
from d500.cli import ArgumentParser


def main(argv: list[str], prog: str) -> int:
    ArgumentParser(prog=prog, description=__doc__).parse_args(argv)
    found = backends.modes()  # from the registry: no framework is imported
    width = max(map(len, found), default=0) + 2
    for name, (about, installed) in found.items():
        state = (backends.version(name) or "installed") if installed else "not installed"
        print(f"{name:<{width}} {state:<14} {about}")
    return 0
