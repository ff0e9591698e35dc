"""One entry's code under several names: a digest of a submission's files that a trivial edit
does not change, and which imported package's entry a package's code already is.

    from d500.competition import same_code
    same_code.digest({"submission.yaml": b"...", "opt.py": b"..."})  # hex digest
    same_code.first_of(ledger, pkg)   # Copy(entry, sha256) of the first package imported with
                                      # this code under another entry name, or None
    same_code.copies(ledger)          # {package sha256: Copy} of every such later package

"The same code": the same files by path, where
- `submission.yaml` is read as YAML and compared without what does not change training (its
  `name`, `description`, `authors` and `workloads`);
- a Python file is compared as its syntax tree (`ast.dump`, no positions): comments, blank lines,
  spacing and docstrings do not count, nor the names of a function's local variables (renamed
  by where they are bound, with Python's scope rules: a parameter, a global read, a class
  attribute, a module-level name, a function's name or an attribute keep theirs: a caller may
  pass a parameter by keyword, d500 reads some classes' parameters by name); a file that calls
  `locals`, `vars`, `eval`, `exec`, `globals` or reads frames, or uses `match` or `:=`, keeps
  every name;
- any other file is compared byte for byte (sha256).
Other edits (a renamed attribute, method or file, statements reordered, dead code, a changed
constant or hyperparameter) make another digest: see the README's *What the checks cannot prove*.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NOT_TRAINING = ("name", "description", "authors", "workloads")  # submission.yaml keys dropped
INTROSPECTION = {"locals", "vars", "eval", "exec", "globals", "_getframe", "currentframe",
                 "f_locals", "co_varnames", "signature", "getfullargspec"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def digest(files: dict[str, bytes]) -> str:
    """The code's digest: each file by its path and its normal form (module docstring)."""
    sha = hashlib.sha256()
    for rel in sorted(files):
        sha.update(f"{rel}\0{_form(rel, files[rel])}\0".encode())
    return sha.hexdigest()


def _form(rel: str, data: bytes) -> str:
    if rel == "submission.yaml":
        try:
            spec = yaml.safe_load(data)
        except yaml.YAMLError:
            spec = None
        if isinstance(spec, dict):
            kept = {str(k): v for k, v in spec.items() if k not in NOT_TRAINING}
            return "yaml:" + json.dumps(kept, sort_keys=True, default=str)
    elif rel.endswith(".py"):
        try:
            return "py:" + python_form(data.decode())
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            pass
    return "bytes:" + hashlib.sha256(data).hexdigest()


def python_form(source: str) -> str:
    """A Python file's syntax tree without docstrings, its functions' locals (not their
    parameters) renamed."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    if not _introspects(tree):
        _Renamer().scope(tree, None)
    return ast.dump(tree, annotate_fields=True, include_attributes=False)


def _introspects(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.NamedExpr, ast.Match)):
            return True
        if isinstance(node, ast.Name) and node.id in INTROSPECTION:
            return True
        if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
            return True
    return False


@dataclass
class _Scope:
    """A function-like scope: the names it binds (renamed) and those it binds but keeps."""

    parent: _Scope | None
    bound: set[str]
    kept: set[str]
    outward: set[str]  # declared nonlocal: the enclosing function's
    renamed: dict[str, str]


class _Renamer:
    """Renames each name bound in a function, lambda or comprehension to #N by the order in
    which its binding scope is first met; names of the module and of class bodies stay."""

    def __init__(self) -> None:
        self.count = 0

    def scope(self, node: ast.AST, parent: _Scope | None) -> None:
        """Visit a module or a function-like node as one scope."""
        if isinstance(node, ast.Module):
            self.visit_all(node.body, None)
            return
        args = getattr(node, "args", None)
        params = [] if args is None else [
            a for a in (args.posonlyargs + args.args + args.kwonlyargs
                        + [args.vararg, args.kwarg]) if a is not None]
        body = (node.body if isinstance(node.body, list) else [node.body]) \
            if not _comprehension(node) else [node]
        bound, kept, outward = _bindings(node, body)
        here = _Scope(parent, bound - {a.arg for a in params},
                      kept | {a.arg for a in params}, outward, {})
        if _comprehension(node):
            for i, gen in enumerate(node.generators):  # type: ignore[attr-defined]
                self.visit(gen.iter, parent if i == 0 else here)
                self.visit(gen.target, here)
                for cond in gen.ifs:
                    self.visit(cond, here)
            for part in ("elt", "key", "value"):
                if getattr(node, part, None) is not None:
                    self.visit(getattr(node, part), here)
        else:
            self.visit_all(body, here)

    def name(self, scope: _Scope, name: str) -> str:
        if name not in scope.renamed:
            scope.renamed[name] = f"#{self.count}"
            self.count += 1
        return scope.renamed[name]

    def visit_all(self, nodes: list[ast.AST], scope: _Scope | None) -> None:
        for n in nodes:
            self.visit(n, scope)

    def visit(self, node: ast.AST, scope: _Scope | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
                self.visit(default, scope)  # evaluated where the function is defined
            for deco in getattr(node, "decorator_list", []):
                self.visit(deco, scope)
            self.scope(node, scope)
            return
        if _comprehension(node):
            self.scope(node, scope)
            return
        if isinstance(node, ast.ClassDef):  # its body's names are attributes: kept
            for part in node.bases + node.keywords + node.decorator_list:
                self.visit(part, scope)
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.visit(stmt, scope)  # a method sees the enclosing function, not the class
            return
        if isinstance(node, ast.Name):
            node.id = self.resolve(scope, node.id)
            return
        for child in ast.iter_child_nodes(node):
            self.visit(child, scope)

    def resolve(self, scope: _Scope | None, name: str) -> str:
        """The name where it is bound: #N in the function-like scope binding it, else kept."""
        while scope is not None:
            if name in scope.kept:
                return name
            if name in scope.bound and name not in scope.outward:
                return self.name(scope, name)
            scope = scope.parent  # not bound here, or nonlocal: the enclosing function's
        return name


def _comprehension(node: ast.AST) -> bool:
    return isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))


def _bindings(node: ast.AST, body: list[ast.AST]) -> tuple[set[str], set[str], set[str]]:
    """(renamable, kept, nonlocal) names the scope `node` binds, by its own
    statements (nested functions, lambdas, comprehensions and classes bind in theirs)."""
    bound: set[str] = set()
    kept: set[str] = set()
    outward: set[str] = set()
    if _comprehension(node):
        for gen in node.generators:  # type: ignore[attr-defined]
            bound |= {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        return bound, kept, outward
    args = getattr(node, "args", None)
    if args is not None:
        bound |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                  + [args.vararg, args.kwarg] if a is not None}
    stack = list(body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Global):
            kept |= set(n.names)  # a module name: never renamed
            continue
        if isinstance(n, ast.Nonlocal):
            outward |= set(n.names)
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            kept |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            kept.add(n.name)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            # their defaults, decorators and bases belong to this scope, their bodies do not
            if not isinstance(n, ast.ClassDef):
                stack += n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
            stack += getattr(n, "decorator_list", []) + getattr(n, "bases", [])
            continue
        if _comprehension(n):
            stack.append(n.generators[0].iter)  # type: ignore[attr-defined]
            continue
        stack += list(ast.iter_child_nodes(n))
    bound -= kept | outward
    return bound, kept, outward


# ------------------------------------------------------------ packages in a ledger

@dataclass(frozen=True)
class Copy:
    """The package whose code another one's is: its entry name and sha256."""

    entry: str
    sha256: str


def folder_files(folder: Path) -> dict[str, bytes] | None:
    """{path: bytes} of an extracted package's submission folder (None: not there)."""
    if not folder.is_dir():
        return None
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def imported(ledger: Any) -> list[tuple[str, str, str]]:
    """(entry, package sha256, code digest) of every package imported whose submission files
    are still where the import put them: those imported whole oldest first, then the forced
    ones oldest first (a forced package is never the first of its code while a whole one of
    it is there: else an honest copy imported after it ranked nowhere)."""
    from d500.ledger.imports import package_folder
    out = []
    for p in sorted(ledger.packages(), key=lambda p: bool(p["forced"])):  # (stable)
        files = folder_files(package_folder(ledger, p["sha256"]) / "files" / "submission")
        if files:
            out.append((p["entry"], p["sha256"], digest(files)))
    return out


def copies(ledger: Any) -> dict[str, Copy]:
    """{package sha256: the first imported package of its code under another entry name} for
    every package whose code an earlier-imported entry of another name already is."""
    first: dict[str, Copy] = {}
    out = {}
    for entry, sha, code in imported(ledger):
        original = first.setdefault(code, Copy(entry, sha))
        if original.entry != entry:
            out[sha] = original
    return out


def first_of(ledger: Any, pkg: Any) -> Copy | None:
    """The first package imported into `ledger` whose code `pkg`'s is, when its entry has
    another name (None: none has this code, or the first was this entry's)."""
    entry = str(pkg.manifest.get("entry", ""))
    code = digest(pkg.submission_files())
    first = next((Copy(e, sha) for e, sha, c in imported(ledger) if c == code), None)
    return first if first is not None and first.entry != entry else None


def line(entry: str, copy: Copy) -> str:
    """The one line check and import say."""
    return (f"entry {entry}'s code is entry {copy.entry}'s (package {copy.sha256[:12]}, "
            f"imported first; the same files up to local names, comments and docstrings): on "
            f"the boards they are one entry, ranked as {copy.entry}; {entry}'s rows are listed "
            f"after it, unranked")
