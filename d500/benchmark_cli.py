"""`d500 benchmark [NAME [ARGS...]]`: list or run the benchmarks/ scripts from any directory."""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path
from typing import Any

from d500.errors import UsageError, did_you_mean


def folder() -> Path:
    """The benchmarks/ folder beside the d500 package: it ships with a checkout, not a wheel."""
    found = Path(__file__).resolve().parent.parent / "benchmarks"
    if not found.is_dir():
        raise UsageError(f"no benchmarks/ folder beside {Path(__file__).resolve().parent}: the "
                         f"benchmarks ship with a checkout of d500 (git clone, then make install), "
                         f"not with an installed package")
    return found


def summary(path: Path) -> str | None:
    """A script's one-line docstring if it is a benchmark (it runs as __main__), else None."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    runs = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body)
    if not runs:
        return None
    doc = (ast.get_docstring(tree) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())  # the first paragraph, on one line


def benchmarks() -> dict[str, tuple[Path, str]]:
    """name -> (script, one-line docstring) for every runnable script in benchmarks/."""
    found = {}
    for path in sorted(folder().glob("*.py")):
        if path.name.startswith("_"):
            continue
        line = summary(path)
        if line is not None:
            found[path.stem] = (path, line)
    return found


def script(name: str) -> Path:
    """The script that NAME (with or without .py) names; one line if there is none."""
    known = benchmarks()
    stem = name[:-3] if name.endswith(".py") else name
    if stem in known:
        return known[stem][0]
    if (folder() / f"{stem}.py").is_file():
        raise UsageError(f"benchmarks/{stem}.py is a module the benchmarks share, not a "
                         f"benchmark; `d500 benchmark` lists them")
    hint = did_you_mean(stem, known)
    hint = f" ({hint})" if hint else ""
    raise UsageError(f"no benchmark named '{name}' in {folder()}{hint}; "
                     f"`d500 benchmark` lists them")


def main(argv: list[str], prog: str = "d500 benchmark") -> int:
    from d500.cli import ArgumentParser
    parser = ArgumentParser(prog=prog, description=__doc__.split(":", 1)[1].strip(),
                            epilog="Arguments after NAME go to the script: "
                                   "d500 benchmark compiled_torch --help")
    parser.add_argument("name", nargs="?", help="a script's name, e.g. compiled_torch")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    args = parser.parse_args(argv)
    if args.name is None:
        known = benchmarks()
        width = max(map(len, known))
        for name, (_, line) in known.items():
            print(f"{name:<{width}}  {line}")
        return 0
    path = script(args.name)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-c", RUN, str(path), *args.args])
    return 0  # not reached: execv replaces this process


# The script as `python SCRIPT ARGS` runs it (its folder first on sys.path), its argparse usage
# errors one line each, as d500's own are.
RUN = """import os, runpy, sys
from d500.benchmark_cli import one_line_usage_errors
one_line_usage_errors("d500 benchmark " + os.path.basename(sys.argv[1])[:-3])
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(sys.argv[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def one_line_usage_errors(prog: str | None = None) -> None:
    """Every argparse parser in this process says a usage error in one line, with the closest
    option or choice (d500.cli's hint), and exits 2, instead of printing its usage first; one
    given no prog is named `prog` (the command typed, `d500 benchmark bytecode`, not the
    script's file name, 'bytecode.py: error: ...')."""
    from d500.cli import _with_hint

    if prog is not None:
        init = argparse.ArgumentParser.__init__

        def named(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
            if not args and kwargs.get("prog") is None:
                kwargs["prog"] = prog
            init(self, *args, **kwargs)

        argparse.ArgumentParser.__init__ = named  # type: ignore[method-assign]

    def error(self: argparse.ArgumentParser, message: str) -> None:
        sys.stderr.write(f"{self.prog}: error: {_with_hint(self, message)}\n")
        sys.exit(2)

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
