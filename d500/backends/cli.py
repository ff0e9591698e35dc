"""`d500 backends`: list known backends, whether their framework is installed, and its version."""

from __future__ import annotations

from d500 import backends
from d500.cli import ArgumentParser


def main(argv: list[str], prog: str) -> int:
    ArgumentParser(prog=prog, description=__doc__).parse_args(argv)
    installed = set(backends.installed())
    for name, target in backends.available().items():
        state = "installed" if name in installed else "not installed"
        print(f"{name:<12} {state:<14} {target}")
    return 0
