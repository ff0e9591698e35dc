"""The normal form of a package's Python files: what is left when what its code cannot read is
taken out (names it binds itself, the order of its definitions, code nothing reaches).

    from d500.competition import code_form
    code_form.forms({"opt.py": "...", "util.py": "..."}, keep={"Guarded", "lr"})  # {path: form}

`keep`: words the package's other files say (submission.yaml's values, a C file's text): a
name among them keeps its name. Each rule is written so that two packages of one form run the
same (up to the names their code binds, which it reads only by introspection, and then every
name is kept; and a file that fails on import, which has no runs):
- a function's locals are renamed by Python's scope rules, per function (not per file);
- a module-level function, class or constant bound once and named nowhere else (no other file,
  no string, not `keep`) is renamed, in each file by order of first use;
- an attribute is renamed across the package where only the package can name it: every use is
  on `self`/`cls` of a method of the package's class, on `super()`, on such a class, on a new
  instance of it or on an attribute only ever set to one (`self.h = C(...)`), every
  class that uses it has only the package's, d500's or no base classes (no decorator, no
  metaclass), and the name is in no string, not in `keep`, not a public word of d500's source
  nor a private one of the modules of the package's d500 base classes (`public_words`), not
  a builtin type's attribute, not `__dunder__`;
- a function's or method's parameters are renamed by position where every use of it is a call
  of it in the package (no `**`); a keyword at such a call is renamed with its parameter;
- dead code goes: statements after `return`/`raise`/`break`/`continue`, `if <constant>:`'s
  branch not taken, bare constants and `pass`, when they bind nothing and do not yield;
  module-level definitions nothing reaches, methods and class attributes nothing names,
  `self.x = <constant>` and `local = <constant>` never read, when defining them runs nothing
  but d500's record classes and builtin containers (and subclassing their d500 bases runs no
  code);
- module-level definitions (and a class's methods) defined so are put in one order:
  dependencies first, then by their form with the package's names blanked; and a run of
  independent `local = <expression without calls, * or in>` lines in a function, when no method
  of the package can run in such an expression.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

# a file using any of these keeps every name its functions bind (they read names)
INTROSPECTION = {"locals", "vars", "eval", "exec", "globals", "_getframe", "currentframe",
                 "f_locals", "co_varnames", "signature", "getfullargspec"}
# a package using any of these keeps every name of its own (they read a definition's name)
REFLECTION = INTROSPECTION | {
    "__name__", "__qualname__", "__dict__", "__module__", "__annotations__", "__code__",
    "__kwdefaults__", "__getattr__", "__getattribute__", "__setattr__", "__delattr__",
    "__slots__", "dir", "attrgetter", "methodcaller", "get_type_hints", "inspect",
    "__init_subclass__", "__set_name__", "getmembers", "__subclasses__"}
ACCESS = {"getattr", "setattr", "hasattr", "delattr"}  # reflection unless the name is a string
SAFE_CALLS = {"dict", "list", "tuple", "set", "frozenset", "float", "int", "str", "bool"}
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_WORD = re.compile(r"[A-Za-z_]\w*")
_QUOTED = re.compile(r"""["'](_[A-Za-z_]\w*)["']""")  # a private name as a string: getattr's
_BLANK = "?"


@functools.lru_cache(maxsize=1)
def foreign_words() -> frozenset[str]:
    """Names code outside the package may read on its objects: d500's public words
    (`public_words`), the attributes of builtin types and the builtins."""
    words = set(dir(builtins))
    for kind in (object, type, dict, list, tuple, set, frozenset, str, bytes, int, float,
                 complex, BaseException, io.IOBase):
        words |= set(dir(kind))
    return frozenset(words | public_words(_d500_sources()))


def _d500_sources() -> list[str]:
    return [p.read_text(errors="replace")
            for p in sorted(Path(__file__).resolve().parents[1].rglob("*.py"))]


def public_words(sources: list[str]) -> set[str]:
    """The words of d500's source texts that d500 may read on a package's object by name: every
    word but the private ones (`_name`, not `__name__`), which d500 reads only on its own
    objects, through its own modules' code; a private name quoted whole (`getattr(x, "_name")`)
    is kept. So the digest does not move when d500 gains a private name (an entry's private
    `_columns` was once kept, and its renamed copy no longer matched, the day d500.progress
    gained its own); the private names of the modules of the d500 classes a package subclasses
    are kept for it (`base_words`): code there may read them on the package's instances."""
    words: set[str] = set()
    for text in sources:
        words |= {w for w in _WORD.findall(text) if not _private(w)}
        words |= set(_QUOTED.findall(text))
    return words


def _private(word: str) -> bool:
    return word.startswith("_") and not (word.startswith("__") and word.endswith("__"))


def base_words(bound: tuple[str, str | None] | None, parts: tuple[str, ...]) -> frozenset[str]:
    """The private words the d500 class root.parts (`_resolve`) may read on a package's instance
    of it: those of the modules of it and its d500 ancestors (every private word of d500 where
    it cannot be imported here)."""
    obj = _resolve(bound, parts)
    modules = {k.__module__ for k in obj.__mro__} if isinstance(obj, type) else {None}
    ours = [m for m in modules if m is None or m == "d500" or m.startswith("d500.")]
    return _module_private_words(tuple(sorted(ours, key=str)))


@functools.lru_cache(maxsize=64)
def _module_private_words(modules: tuple[str | None, ...]) -> frozenset[str]:
    import sys
    texts = []
    for name in modules:
        path = getattr(sys.modules.get(name or ""), "__file__", None)
        if name is None or path is None:
            texts = _d500_sources()  # not resolved: every private word of d500
            break
        texts.append(Path(path).read_text(errors="replace"))
    return frozenset(w for text in texts for w in _WORD.findall(text) if _private(w))


def words_of(text: str) -> set[str]:
    """The identifiers a text holds."""
    return set(_WORD.findall(text))


def strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, *_DEFS))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]


def introspects(tree: ast.AST, names: set[str] = INTROSPECTION) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.NamedExpr, ast.Match)):
            return True
        if isinstance(node, ast.Name) and node.id in names and not (
                names is REFLECTION and node.id == "__name__"):  # the module's: not renamed
            return True
        if isinstance(node, ast.Attribute) and node.attr in names:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                a.name.split(".")[0] in names or a.name in names for a in node.names):
            return True
        if names is REFLECTION and isinstance(node, ast.Call) and isinstance(
                node.func, ast.Name) and node.func.id in ACCESS and not (
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            return True
    return False


def dump(tree: ast.AST) -> str:
    return ast.dump(tree, annotate_fields=True, include_attributes=False)


# ------------------------------------------------------------------------- the package

def forms(sources: dict[str, str], keep: set[str] = frozenset(), numbers: bool = True
          ) -> dict[str, str]:
    """{path: normal form} of the package's Python files that parse (the others are left out);
    `numbers=False`: every number counts as one."""
    trees: dict[str, ast.Module] = {}
    for rel, text in sources.items():
        try:
            trees[rel] = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        strip_docstrings(trees[rel])
        _prune(trees[rel])
    if any(introspects(t, REFLECTION) for t in trees.values()):
        out = {}
        for rel, tree in trees.items():  # locals only, file by file
            if not introspects(tree):
                _Renamer(_Names()).scope(tree, None)
            out[rel] = dump(tree if numbers else _blank_numbers(tree))
        return out
    for tree in trees.values():
        _drop_unread_locals(tree)
    strings = set(keep)
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings |= words_of(node.value)
    facts = _Facts(trees, strings)
    for tree in trees.values():
        _rename_keywords(tree, facts)
    for tree in trees.values():
        _drop_dead(tree, facts)
        _reorder(tree, facts)
    names = _Names(attrs=facts.attrs, commute=facts.commute)
    out = {}
    for rel in sorted(trees):
        names.module, names.taken = facts.module[rel], {}
        _Renamer(names, facts.internal).scope(trees[rel], None)
        out[rel] = dump(trees[rel] if numbers else _blank_numbers(trees[rel]))
    return out


def _blank_numbers(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex)) \
                and not isinstance(node.value, bool):
            node.value = "#number"
    return tree


@dataclass
class _Names:
    """The package's renamable names (module-level: this file's; attributes: the package's) and
    what each is called so far, numbered by first use (`blank`: every one is `?`)."""

    module: set[str] = field(default_factory=set)
    attrs: set[str] = field(default_factory=set)
    taken: dict[str, str] = field(default_factory=dict)
    attr_taken: dict[str, str] = field(default_factory=dict)
    blank: bool = False
    commute: bool = False  # independent assignments in a function may be put in one order

    def glob(self, name: str) -> str:
        if name not in self.module:
            return name
        if self.blank:
            return _BLANK
        return self.taken.setdefault(name, f"$g{len(self.taken)}")

    def attr(self, name: str) -> str:
        if name not in self.attrs:
            return name
        if self.blank:
            return _BLANK
        return self.attr_taken.setdefault(name, f"$a{len(self.attr_taken)}")


def _bound_anywhere(tree: ast.AST) -> dict[str, int]:
    """How often each name is bound in a file, in any scope."""
    count: dict[str, int] = {}

    def add(name: str) -> None:
        count[name] = count.get(name, 0) + 1
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            add(n.id)
        elif isinstance(n, (*_DEFS, ast.ClassDef)):
            add(n.name)
        elif isinstance(n, ast.arg):
            add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                add((a.asname or a.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            for name in n.names:
                add(name)
                add(name)  # never renamed
    return count


def _params(fn: ast.AST) -> list[ast.arg]:
    a = fn.args  # type: ignore[attr-defined]
    return [p for p in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
            if p is not None]


def _keyword_index(fn: ast.AST, name: str) -> int | None:
    a = fn.args  # type: ignore[attr-defined]
    ps = _params(fn)
    if any(p.arg == name for p in a.args + a.kwonlyargs):
        return next(i for i, p in enumerate(ps) if p.arg == name)
    return None


def _param_name(fn: ast.AST, i: int) -> str:
    a = fn.args  # type: ignore[attr-defined]
    p = _params(fn)[i]
    return "@*" if p is a.vararg else "@**" if p is a.kwarg else f"@{i}"


class _Facts:
    """Which names of the package can be renamed, which classes are its own, which functions
    only it calls."""

    def __init__(self, trees: dict[str, ast.Module], strings: set[str]) -> None:
        self.trees = trees
        self.count = {rel: _bound_anywhere(tree) for rel, tree in trees.items()}
        self.strings = strings
        self.keep_attr = strings | foreign_words()
        self.module: dict[str, set[str]] = {}
        self.imports: dict[str, dict[str, str]] = {}  # per file: local name -> module
        self.binds: dict[str, dict[str, tuple[str, str | None]]] = {}  # (module, its name)
        self.classes: dict[int, ast.ClassDef] = {}
        self.closed: set[int] = set()  # ids of classes with only own, d500 or no bases
        self.hooked: set[int] = set()  # closed, but a d500 base runs code when subclassed
        self.internal: dict[int, ast.AST] = {}  # id(fn) -> fn whose parameters are renamed
        self.internal_fns: dict[str, dict[str, ast.AST]] = {}  # file -> name -> fn
        self.methods: dict[str, list[ast.AST]] = {}
        self.internal_methods: set[str] = set()
        self.class_names: set[str] = set()  # names bound in any class body
        self.used_attrs: set[str] = set()  # named other than by `x.a = <constant>`
        self.class_loads: set[str] = set()  # read by a name in a class body
        self.class_bound: set[str] = set()  # bound in a class body (a method, a descriptor)
        self.makes: dict[str, set[str]] = {}  # per file: classes whose call makes an own object
        self.typed: set[str] = set()  # attributes only ever set to such an object
        self.rel = ""  # the file being walked
        for rel, tree in trees.items():
            self._module_names(rel, tree)
        self._classes()
        self.attrs = self._attrs()
        self._internal()
        # no method of the package's runs when an expression without calls is evaluated
        self.commute = not any(
            isinstance(s, _DEFS) and (s.name.startswith("__") and s.name != "__init__"
                                      or s.decorator_list)
            for c in self.classes.values() for s in c.body)

    def _module_names(self, rel: str, tree: ast.Module) -> None:
        others: set[str] = set()
        for other, t in self.trees.items():
            if other != rel:
                for n in ast.walk(t):
                    others |= {v for v in (getattr(n, "id", None), getattr(n, "attr", None),
                                           getattr(n, "name", None), getattr(n, "arg", None),
                                           getattr(n, "module", None), getattr(n, "asname", None))
                               if isinstance(v, str)}
                    if isinstance(n, ast.alias):
                        others |= set(n.name.split("."))
        count = self.count[rel]
        self.imports[rel] = {}
        self.binds[rel] = {}
        for n in tree.body:
            if isinstance(n, ast.ImportFrom):
                for a in n.names:
                    self.imports[rel][a.asname or a.name] = n.module or ""
                    self.binds[rel][a.asname or a.name] = (n.module or "", a.name)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    local = (a.asname or a.name).split(".")[0]
                    self.imports[rel][local] = a.name
                    self.binds[rel][local] = (a.name if a.asname else local, None)
        top = set()
        for n in tree.body:
            if isinstance(n, (*_DEFS, ast.ClassDef)):
                top.add(n.name)
            elif isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) for t in n.targets):
                top |= {t.id for t in n.targets}  # type: ignore[attr-defined]
        keep = self.strings | others | set(dir(builtins))
        self.module[rel] = {x for x in top if count.get(x) == 1 and x not in keep
                            and not x.startswith("__")}

    def _classes(self) -> None:
        for rel, tree in self.trees.items():
            own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.classes[id(node)] = node
                    for s in node.body:
                        self.class_bound |= _defines(s)
                        if isinstance(s, _DEFS) and s.decorator_list:  # a property's setter
                            self.used_attrs.add(s.name)
                            self.class_loads |= set().union(*map(_loads, s.decorator_list))
                        for t in ast.walk(s) if not isinstance(s, _DEFS) else []:
                            if isinstance(t, ast.Name):
                                self.class_names.add(t.id)
                                if isinstance(t.ctx, ast.Load):
                                    self.class_loads.add(t.id)
            changed = True
            while changed:
                changed = False
                for node in ast.walk(tree):
                    if not isinstance(node, ast.ClassDef) or id(node) in self.closed:
                        continue
                    if node.decorator_list or node.keywords:
                        continue
                    if all(self._base_ok(rel, b, own, node) for b in node.bases):
                        self.closed.add(id(node))
                        changed = True

    def binds_of(self, imports: dict[str, str]) -> dict[str, tuple[str, str | None]]:
        return next(self.binds[r] for r in self.imports if self.imports[r] is imports)

    def _base_ok(self, rel: str, base: ast.expr, own: dict[str, ast.ClassDef],
                 node: ast.ClassDef | None = None) -> bool:
        root = base
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name):
            return False
        if isinstance(base, ast.Name) and base.id in own:
            if node is not None and id(own[base.id]) in self.hooked:
                self.hooked.add(id(node))
            return id(own[base.id]) in self.closed
        if isinstance(base, ast.Name) and base.id == "object":
            return True
        module = self.imports[rel].get(root.id, "")
        if not (module == "d500" or module.startswith("d500.")):
            return False
        parts = []
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if node is not None and not _plain_class(self.binds[rel].get(root.id), tuple(parts)):
            self.hooked.add(id(node))
        self.keep_attr |= base_words(self.binds[rel].get(root.id), tuple(parts))
        return True

    def _attrs(self) -> set[str]:
        """Attribute names only the package names (see the module's docstring)."""
        bound: set[str] = set()
        foreign: set[str] = set()
        self.makes = {rel: self._makers(tree) for rel, tree in self.trees.items()}
        self.typed = self._typed()
        for rel, tree in self.trees.items():
            own_classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)
                           and self.count[rel].get(n.name) == 1 and id(n) in self.closed}
            stored = {id(n.targets[0]) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                      and len(n.targets) == 1 and isinstance(n.value, ast.Constant)}
            self.used_attrs |= {n.attr for n in ast.walk(tree)
                                if isinstance(n, ast.Attribute) and id(n) not in stored}
            self.rel = rel
            self._walk(tree, set(), None, own_classes, bound, foreign)
        return {a for a in bound - foreign - self.keep_attr if not a.startswith("__")}

    def _makers(self, tree: ast.Module) -> set[str]:
        """The file's module-level classes whose call makes an instance of the package's own
        closed class: bound once, no __new__ in it or its bases, no hook in a d500 base."""
        rel = next(r for r, t in self.trees.items() if t is tree)
        own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)
               and self.count[rel].get(n.name) == 1}

        def plain(c: ast.ClassDef, seen: int = 0) -> bool:
            return (id(c) in self.closed and id(c) not in self.hooked and seen < 50
                    and "__new__" not in set().union(*map(_defines, c.body))
                    and all(plain(own[b.id], seen + 1) for b in c.bases
                            if isinstance(b, ast.Name) and b.id in own))
        return {name for name, c in own.items() if plain(c)}

    def _typed(self) -> set[str]:
        """Attributes only ever set, in the package, to a new instance of its own closed
        class (`x.a = C(...)`), never in a class body, in no string, not d500's words."""
        made: set[str] = set()
        other: set[str] = set(self.class_bound) | self.keep_attr
        for rel, tree in self.trees.items():
            ok = {id(n.targets[0]) for n in ast.walk(tree)
                  if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Attribute)
                  and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                  and n.value.func.id in self.makes[rel]}
            for n in ast.walk(tree):
                if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
                    (made if id(n) in ok else other).add(n.attr)
        return made - other

    def _walk(self, node: ast.AST, own: set[str], cls: ast.ClassDef | None,
              own_classes: set[str], bound: set[str], foreign: set[str]) -> None:
        """Sort every attribute use into bound-by-the-package and possibly another's."""
        if isinstance(node, ast.ClassDef):
            closed = id(node) in self.closed
            for part in node.bases + node.keywords + node.decorator_list:
                self._walk(part, own, cls, own_classes, bound, foreign)
            for s in node.body:
                names = {s.name} if isinstance(s, _DEFS) else {
                    t.id for t in ast.walk(s) if isinstance(t, ast.Name)
                    and isinstance(t.ctx, ast.Store)}
                (bound if closed else foreign).update(names)
                if isinstance(s, _DEFS):
                    self.methods.setdefault(s.name, []).append(s)
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                 for d in s.decorator_list)
                    ps = _params(s)
                    me = set() if static or not ps or any(
                        isinstance(t, ast.Name) and t.id == ps[0].arg
                        and not isinstance(t.ctx, ast.Load) for t in ast.walk(s)) \
                        else {ps[0].arg}
                    for d in s.decorator_list + s.args.defaults + [
                            d for d in s.args.kw_defaults if d is not None]:
                        self._walk(d, own, cls, own_classes, bound, foreign)
                    for b in s.body:  # (an enclosing method's self is not this class's)
                        self._walk(b, me, node, own_classes, bound, foreign)
                else:
                    self._walk(s, own, cls, own_classes, bound, foreign)
            return
        if isinstance(node, (*_DEFS, ast.Lambda)):
            hidden = {p.arg for p in _params(node)}
            for child in ast.iter_child_nodes(node):
                self._walk(child, own - hidden, cls, own_classes, bound, foreign)
            return
        if isinstance(node, ast.Attribute):
            v = node.value
            mine = ((isinstance(v, ast.Name) and v.id in own and cls is not None
                     and id(cls) in self.closed)
                    or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                        and v.func.id == "super" and not v.args and cls is not None
                        and id(cls) in self.closed)
                    or (isinstance(v, ast.Name) and v.id in own_classes
                        and v.id not in self.class_names)
                    or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                        and v.func.id in self.makes[self.rel])  # C(...).a
                    or (isinstance(v, ast.Attribute) and v.attr in self.typed  # self.c.a
                        and isinstance(v.value, ast.Name) and v.value.id in own
                        and cls is not None and id(cls) in self.closed))
            if not mine:
                foreign.add(node.attr)
            elif not isinstance(node.ctx, ast.Load):
                bound.add(node.attr)
        for child in ast.iter_child_nodes(node):
            self._walk(child, own, cls, own_classes, bound, foreign)

    def _internal(self) -> None:
        """Functions and methods only called, by the package, without `**`."""
        for rel, tree in self.trees.items():
            count = self.count[rel]
            fns = {n.name: n for n in tree.body if isinstance(n, _DEFS) and not n.decorator_list
                   and n.name in self.module[rel] and count.get(n.name) == 1}
            calls: dict[str, list[ast.Call]] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    calls.setdefault(node.func.id, []).append(node)
            called = {id(c.func) for cs in calls.values() for c in cs}
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id in fns and id(node) not in called:
                    fns.pop(node.id)
            for name, fn in list(fns.items()):
                if not all(self._keywords_fit(c, [fn]) for c in calls.get(name, [])):
                    fns.pop(name)
            self.internal_fns[rel] = fns
            self.internal.update({id(fn): fn for fn in fns.values()})
        calls = {}
        bare = set()
        for tree in self.trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    calls.setdefault(node.func.attr, []).append(node)
            funcs = {id(c.func) for cs in calls.values() for c in cs}
            bare |= {n.attr for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and id(n) not in funcs}
        for name, defs in self.methods.items():
            if (name in self.attrs and name not in bare and name not in self.class_names
                    and all(not d.decorator_list for d in defs)  # type: ignore[attr-defined]
                    and all(self._keywords_fit(c, defs) for c in calls.get(name, []))):
                self.internal_methods.add(name)
                self.internal.update({id(d): d for d in defs})

    @staticmethod
    def _keywords_fit(call: ast.Call, defs: list[ast.AST]) -> bool:
        for k in call.keywords:
            if k.arg is None:
                return False
            at = {_keyword_index(d, k.arg) for d in defs}
            if len(at) != 1 or (None in at and not all(d.args.kwarg for d in defs)):  # type: ignore[attr-defined]
                return False
        return True


_UNKNOWN = object()  # (`_resolve`: not importable here)


def _resolve(bound: tuple[str, str | None] | None, parts: tuple[str, ...]) -> object:
    """The object root.parts names (its root name imported as `bound`: module, name in it), or
    _UNKNOWN where it cannot be imported here."""
    import importlib
    if bound is None:
        return _UNKNOWN
    try:
        module, name = bound
        obj = importlib.import_module(module)
        if name is not None:
            obj = getattr(obj, name) if hasattr(obj, name) else importlib.import_module(
                f"{module}.{name}")
        for part in parts:
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - not importable here: treat as running code
        return _UNKNOWN
    return obj


@functools.lru_cache(maxsize=256)
def _plain_class(bound: tuple[str, str | None] | None, parts: tuple[str, ...]) -> bool:
    """The d500 class root.parts (its root name imported as `bound`: module, name in it) runs
    no code of its own when subclassed (no __init_subclass__, __set_name__ or metaclass)."""
    obj = _resolve(bound, parts)
    return isinstance(obj, type) and type(obj) is type and not any(
        "__init_subclass__" in vars(k) or any(hasattr(v, "__set_name__")
                                              for v in vars(k).values())
        for k in obj.__mro__[:-1])


@functools.lru_cache(maxsize=256)
def _plain_record(bound: tuple[str, str | None] | None, parts: tuple[str, ...]) -> bool:
    """The d500 name root.parts is a dataclass without __post_init__: calling it only builds
    a record."""
    obj = _resolve(bound, parts)
    return (isinstance(obj, type) and hasattr(obj, "__dataclass_fields__")
            and not hasattr(obj, "__post_init__") and type(obj) is type)


def _rename_keywords(tree: ast.Module, facts: _Facts) -> None:
    """A keyword at a call of an internal function is called as its parameter will be."""
    fns = next((f for rel, f in facts.internal_fns.items() if facts.trees[rel] is tree), {})
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in fns:
            defs = [fns[node.func.id]]
        elif isinstance(node.func, ast.Attribute) and node.func.attr in facts.internal_methods:
            defs = facts.methods[node.func.attr]
        else:
            continue
        for k in node.keywords:
            i = _keyword_index(defs[0], k.arg)  # type: ignore[arg-type]
            if i is not None:
                k.arg = _param_name(defs[0], i)


# -------------------------------------------------------------------------- dead code

def _harmless(stmts: list[ast.stmt]) -> bool:
    """Dropping these cannot change what a function binds or whether it yields."""
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal,
                              ast.Import, ast.ImportFrom, *_DEFS, ast.ClassDef, ast.NamedExpr,
                              ast.ExceptHandler)):
                return False
            if isinstance(n, ast.Name) and (not isinstance(n.ctx, ast.Load) or n.id == "super"):
                return False
    return True


def _prune(node: ast.AST) -> None:
    """Drop unreachable statements, untaken constant branches, bare constants, extra `pass`."""
    for child in ast.iter_child_nodes(node):
        _prune(child)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
            continue
        out: list[ast.stmt] = []
        for i, s in enumerate(block):
            if isinstance(s, ast.If) and isinstance(s.test, ast.Constant):
                taken, dropped = (s.body, s.orelse) if s.test.value else (s.orelse, s.body)
                if _harmless(dropped):
                    out += [t for t in taken if not isinstance(t, ast.Pass)]
                    continue
            if (isinstance(s, ast.While) and isinstance(s.test, ast.Constant)
                    and not s.test.value and _harmless(s.body)):
                out += s.orelse
                continue
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
                continue
            if isinstance(s, ast.Pass):
                continue
            out.append(s)
            if isinstance(s, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
                rest = block[i + 1:]
                if not _harmless(rest):
                    out += rest
                break
        setattr(node, name, out or ([ast.Pass()] if name == "body" else []))


def _drop_unread_locals(tree: ast.Module) -> None:
    """In each function, `x = <constant>` where nothing in the function (or in what it
    defines) names x otherwise, and x is none of its parameters, globals or nonlocals."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (*_DEFS,)):
            continue
        junk: dict[str, list[ast.Assign]] = {}
        for s in ast.walk(fn):
            if (isinstance(s, ast.Assign) and len(s.targets) == 1
                    and isinstance(s.targets[0], ast.Name)
                    and isinstance(s.value, ast.Constant)):
                junk.setdefault(s.targets[0].id, []).append(s)
        if not junk:
            continue
        stores = {id(s.targets[0]) for ss in junk.values() for s in ss}
        named = {p.arg for p in _params(fn)}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and id(n) not in stores:
                named.add(n.id)
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                named |= set(n.names)
            elif isinstance(n, ast.arg):
                named.add(n.arg)
            elif isinstance(n, (*_DEFS, ast.ClassDef)):
                named.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                named |= {(a.asname or a.name).split(".")[0] for a in n.names}
            elif isinstance(n, ast.ExceptHandler) and n.name:
                named.add(n.name)
        own = {id(s) for s in _own_statements(fn)}
        drop = {id(s) for name, ss in junk.items() if name not in named
                and all(id(s) in own for s in ss) for s in ss}
        for node in ast.walk(fn):
            for part in ("body", "orelse", "finalbody"):
                block = getattr(node, part, None)
                if isinstance(block, list) and any(id(s) in drop for s in block):
                    kept = [s for s in block if id(s) not in drop]
                    setattr(node, part, kept or ([ast.Pass()] if part == "body" else []))


def _own_statements(fn: ast.AST) -> list[ast.stmt]:
    """The statements of a function that run in it (not in what it defines)."""
    out = []
    stack = list(fn.body)  # type: ignore[attr-defined]
    while stack:
        s = stack.pop()
        out.append(s)
        if isinstance(s, (*_DEFS, ast.ClassDef)):
            continue
        for part in ("body", "orelse", "finalbody"):
            stack += [x for x in getattr(s, part, []) or [] if isinstance(x, ast.stmt)]
        for h in getattr(s, "handlers", []) or []:
            stack += h.body
    return out


def _pure(node: ast.AST | None, facts: _Facts, imports: dict[str, str]) -> bool:
    """Evaluating it runs nothing but d500's record classes and builtin constructors."""
    if node is None:
        return True
    for n in ast.walk(node):
        if isinstance(n, (ast.Call,)):
            f = n.func
            root = f
            while isinstance(root, ast.Attribute):
                root = root.value
            parts = []
            while isinstance(f, ast.Attribute):
                parts.insert(0, f.attr)
                f = f.value
            ok = isinstance(root, ast.Name) and (
                (not parts and root.id in SAFE_CALLS and root.id not in imports)
                or (imports.get(root.id, "").split(".")[0] == "d500"
                    and _plain_record(facts.binds_of(imports).get(root.id), tuple(parts))))
            if not ok:
                return False
        elif not isinstance(n, (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List,
                                ast.Set, ast.Dict, ast.UnaryOp, ast.Subscript, ast.Starred,
                                ast.keyword, ast.Load, ast.unaryop, ast.BinOp, ast.BitOr,
                                ast.operator, ast.Slice)):
            return False
    return True


def _lazy_annotations(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
               and any(a.name == "annotations" for a in n.names) for n in tree.body)


def _pure_def(node: ast.stmt, facts: _Facts, imports: dict[str, str], lazy: bool,
              method: bool = False) -> bool:
    """Defining it (not calling it) runs nothing but d500's records and builtin containers."""
    if isinstance(node, _DEFS):
        decos_ok = all(method and isinstance(d, ast.Name) and d.id in (
            "staticmethod", "classmethod") and d.id not in imports for d in node.decorator_list)
        annotations = [] if lazy else [p.annotation for p in _params(node)] + [node.returns]
        return decos_ok and all(_pure(d, facts, imports) for d in node.args.defaults + [
            d for d in node.args.kw_defaults if d is not None] + annotations)
    if isinstance(node, ast.ClassDef):
        return (id(node) in facts.closed and id(node) not in facts.hooked
                and all(_pure(b, facts, imports) for b in node.bases)
                and all(_pure_def(s, facts, imports, lazy, method=True) for s in node.body))
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return (all(isinstance(t, ast.Name) for t in targets) and _pure(node.value, facts, imports)
                and (lazy or not isinstance(node, ast.AnnAssign)
                     or _pure(node.annotation, facts, imports)))
    return isinstance(node, ast.Pass)


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (*_DEFS, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _drop_dead(tree: ast.Module, facts: _Facts) -> None:
    """Module-level definitions nothing reaches, methods and class attributes nothing names,
    constants stored on self and never read."""
    rel = next(r for r, t in facts.trees.items() if t is tree)
    imports, lazy = facts.imports[rel], _lazy_annotations(tree)
    renamable = facts.module[rel]
    candidates = [s for s in tree.body if _defines(s) and _defines(s) <= renamable
                  and _pure_def(s, facts, imports, lazy)]
    refs = {id(s): _loads(s) - _defines(s) if isinstance(s, (ast.Assign, ast.AnnAssign))
            else _loads(s) for s in candidates}
    reached: set[str] = set()
    for s in tree.body:
        if not any(s is c for c in candidates):
            reached |= _loads(s)
    grew = True
    while grew:
        grew = False
        for c in candidates:
            if _defines(c) & reached and not refs[id(c)] <= reached:
                reached |= refs[id(c)]
                grew = True
    dead = {id(c) for c in candidates if not _defines(c) & reached}
    tree.body = [s for s in tree.body if id(s) not in dead] or [ast.Pass()]
    named = facts.used_attrs | facts.class_loads
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            node.body = [s for s in node.body if not (
                _defines(s) and _defines(s) <= facts.attrs - named
                and _pure_def(s, facts, imports, lazy, method=True))] or [ast.Pass()]
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                kept = [s for s in block if not (
                    isinstance(s, ast.Assign) and len(s.targets) == 1
                    and isinstance(s.targets[0], ast.Attribute)
                    and s.targets[0].attr in facts.attrs - named - facts.class_bound
                    and isinstance(s.value, ast.Constant))]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))


# ---------------------------------------------------------------------------- order

def _blank_form(stmt: ast.stmt, facts: _Facts, module: set[str], method: bool = False) -> str:
    """The statement's form with the package's names blanked (its place in no order)."""
    twin = _clone(stmt)
    internal = {id(b): b for a, b in zip(ast.walk(stmt), ast.walk(twin))
                if id(a) in facts.internal}
    names = _Names(module=module, attrs=facts.attrs, blank=True, commute=facts.commute)
    _Renamer(names, internal).visit(twin, None, method=method)
    return dump(twin)


def _clone(node):  # type: ignore[no-untyped-def]
    """A copy of a syntax tree (without positions: faster than deepcopy)."""
    if isinstance(node, ast.AST):
        twin = node.__class__()
        for name, value in ast.iter_fields(node):
            setattr(twin, name, _clone(value))
        return twin
    return [_clone(v) for v in node] if isinstance(node, list) else node


def _order(items: list[ast.stmt], deps: dict[int, set[int]], key: dict[int, str]
           ) -> list[ast.stmt]:
    """Dependencies first, then by key (ties: as they stood)."""
    out: list[ast.stmt] = []
    placed: set[int] = set()
    left = list(items)
    while left:
        ready = [s for s in left if deps[id(s)] <= placed] or left[:1]
        pick = min(ready, key=lambda s: (key[id(s)], left.index(s)))
        out.append(pick)
        placed.add(id(pick))
        left.remove(pick)
    return out


def _reorder(tree: ast.Module, facts: _Facts) -> None:
    """Module-level definitions (and methods) that can move, in one order."""
    rel = next(r for r, t in facts.trees.items() if t is tree)
    imports, lazy = facts.imports[rel], _lazy_annotations(tree)
    module = facts.module[rel]
    count = facts.count[rel]  # (before dead code went: never fewer)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            _reorder_methods(node, facts, module, imports, lazy)
    lead = 0
    while lead < len(tree.body) and isinstance(tree.body[lead], (ast.Import, ast.ImportFrom)):
        lead += 1
    rest = tree.body[lead:]
    movable = [s for s in rest if isinstance(s, (*_DEFS, ast.ClassDef))
               and count.get(s.name) == 1 and s.name not in dir(builtins)
               and _pure_def(s, facts, imports, lazy)]
    by_name = {s.name: s for s in movable}  # type: ignore[attr-defined]
    leading = {(a.asname or a.name).split(".")[0] for s in tree.body[:lead] for a in s.names}
    bound = {x for x in count if x not in leading or count[x] > 1}  # bound later, or twice
    changed = True
    while changed:  # a definition needing what a statement that stays binds stays too
        changed = False
        for s in list(movable):
            at = rest.index(s)
            early = set().union(*(_loads(t) for t in rest[:at] if t not in movable))
            needs = _def_time(s) & bound
            if s.name in early or not needs <= set(by_name):  # type: ignore[attr-defined]
                movable.remove(s)
                by_name.pop(s.name)  # type: ignore[attr-defined]
                changed = True
    if not movable:
        return
    deps = {id(s): {id(by_name[n]) for n in _def_time(s) if n in by_name} for s in movable}
    key = {id(s): _blank_form(s, facts, module) if len(movable) > 1 else "" for s in movable}
    tree.body = (tree.body[:lead] + _order(movable, deps, key)
                 + [s for s in rest if s not in movable])


def _def_time(node: ast.stmt) -> set[str]:
    """Names read when the definition runs (not when it is called)."""
    if isinstance(node, _DEFS):
        parts = node.decorator_list + node.args.defaults + [
            d for d in node.args.kw_defaults if d is not None] + [
            p.annotation for p in _params(node) if p.annotation] + (
            [node.returns] if node.returns else [])
        return set().union(*(_loads(p) for p in parts)) if parts else set()
    if isinstance(node, ast.ClassDef):
        out = set().union(*(_loads(b) for b in node.bases)) if node.bases else set()
        for s in node.body:
            out |= _def_time(s) if isinstance(s, _DEFS) else _loads(s) - _defines(s)
        return out - set().union(*(_defines(s) for s in node.body))
    return set()


def _reorder_methods(node: ast.ClassDef, facts: _Facts, module: set[str],
                     imports: dict[str, str], lazy: bool) -> None:
    others = [s for s in node.body if not isinstance(s, _DEFS)]
    said = set().union(*(_loads(s) for s in others)) if others else set()
    names = [s.name for s in node.body if isinstance(s, _DEFS)]
    class_bound = set().union(*(_defines(s) for s in others)) if others else set()
    movable = [s for s in node.body if isinstance(s, _DEFS) and names.count(s.name) == 1
               and s.name not in said and s.name not in class_bound
               and _pure_def(s, facts, imports, lazy, method=True)
               and not _def_time(s) & class_bound]
    if len(movable) < 2:
        return
    key = {id(s): _blank_form(s, facts, module, method=True) for s in movable}
    node.body = [s for s in node.body if s not in movable] + _order(
        movable, {id(s): set() for s in movable}, key)


# -------------------------------------------------------------------------- renaming

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
    which its binding scope is first met (numbered afresh in each module-level function or
    method); an internal function's parameters to @i by position; the package's renamable
    module-level names and attributes as `names` says; other names stay."""

    def __init__(self, names: _Names, internal: dict[int, ast.AST] | None = None) -> None:
        self.names = names
        self.internal = internal or {}
        self.count = 0
        self.class_names: set[str] | None = None
        self.guarded = 0  # inside try/with: an exception there is caught, lines keep order

    def scope(self, node: ast.AST, parent: _Scope | None) -> None:
        """Visit a module or a function-like node as one scope."""
        if isinstance(node, ast.Module):
            self.visit_all(node.body, None)
            return
        if parent is None:
            self.count = 0  # numbered afresh: a definition's form does not depend on its place
        params = _params(node) if getattr(node, "args", None) is not None else []
        body = (node.body if isinstance(node.body, list) else [node.body]) \
            if not _comprehension(node) else [node]
        bound, kept, outward = _bindings(node, body)
        names = {a.arg for a in params}
        if parent is None and id(node) in self.internal:
            renamed = {p.arg: _param_name(node, i) for i, p in enumerate(params)}
            for p in params:
                p.arg = renamed[p.arg]
            here = _Scope(parent, bound | names, kept - names, outward, renamed)
        else:
            here = _Scope(parent, bound - names, kept | names, outward, {})
        saved, self.class_names = self.class_names, None
        guarded, self.guarded = self.guarded, 0
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
            self.block(body, here)
        self.class_names, self.guarded = saved, guarded

    def name(self, scope: _Scope, name: str) -> str:
        if name not in scope.renamed:
            scope.renamed[name] = f"#{self.count}"
            self.count += 1
        return scope.renamed[name]

    def visit_all(self, nodes: list[ast.AST], scope: _Scope | None) -> None:
        for n in nodes:
            self.visit(n, scope)

    def visit(self, node: ast.AST, scope: _Scope | None, method: bool = False) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
                self.visit(default, scope)  # evaluated where the function is defined
            for deco in getattr(node, "decorator_list", []):
                self.visit(deco, scope)
            for note in [p.annotation for p in _params(node)] + [getattr(node, "returns", None)]:
                if note is not None:
                    self.visit(note, scope)
            if isinstance(node, _DEFS):
                node.name = (self.names.attr(node.name) if method or self.class_names is not None
                             else self.names.glob(node.name) if scope is None else node.name)
            self.scope(node, scope)
            return
        if _comprehension(node):
            self.scope(node, scope)
            return
        if isinstance(node, ast.ClassDef):
            if self.class_names is not None:  # a class in a class body: an attribute
                node.name = self.names.attr(node.name)
            elif scope is None:
                node.name = self.names.glob(node.name)
            for part in node.bases + node.keywords + node.decorator_list:
                self.visit(part, scope)
            here = set().union(*(_defines(s) for s in node.body))
            for stmt in node.body:
                if isinstance(stmt, _DEFS):  # a method sees the enclosing function
                    self.visit(stmt, scope, method=True)
                else:
                    saved, self.class_names = self.class_names, here
                    self.visit(stmt, scope)
                    self.class_names = saved
            return
        if isinstance(node, ast.Attribute):
            node.attr = self.names.attr(node.attr)
        if isinstance(node, ast.Name):
            if self.class_names is not None and node.id in self.class_names:
                node.id = self.names.attr(node.id)  # a class attribute
            else:
                node.id = self.resolve(scope, node.id)
            return
        catches = isinstance(node, (ast.Try, ast.With, ast.AsyncWith, *_TRY_STAR))
        self.guarded += catches
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                self.block(value, scope)
            elif isinstance(value, list):
                self.visit_all([v for v in value if isinstance(v, ast.AST)], scope)
            elif isinstance(value, ast.AST):
                self.visit(value, scope)
        self.guarded -= catches

    def block(self, stmts: list[ast.stmt], scope: _Scope | None) -> None:
        """Visit a function's statements; a run of independent assignments is put in one
        order: what one reads of another's after it, then by form."""
        i = 0
        while i < len(stmts):
            j = i
            while (scope is not None and self.names.commute and not self.guarded
                   and j < len(stmts)
                   and _assigns_freely(stmts[j], scope)):
                j += 1
            if j - i < 2:
                self.visit(stmts[i], scope)
                i += 1
                continue
            lo = self.count
            self.visit_all(stmts[i:j], scope)
            stmts[i:j] = self.commute(stmts[i:j], scope, lo)
            i = j

    def commute(self, run: list[ast.stmt], scope: _Scope, lo: int) -> list[ast.stmt]:
        """The run in one order, its new locals numbered again by that order."""
        new = {f"#{k}" for k in range(lo, self.count)}

        def ids(node: ast.AST) -> set[str]:
            return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        target = {id(s): s.targets[0].id for s in run}  # type: ignore[attr-defined]
        deps: dict[int, set[int]] = {}
        for b, s in enumerate(run):
            reads = ids(s.value)  # type: ignore[attr-defined]
            deps[id(s)] = {id(t) for t in run[:b] if target[id(t)] in reads
                           or target[id(s)] in ids(t.value)  # type: ignore[attr-defined]
                           or target[id(t)] == target[id(s)]}
        key = {}
        for s in run:
            twin = _clone(s)
            for n in ast.walk(twin):
                if isinstance(n, ast.Name) and n.id in new:
                    n.id = "#?"
            key[id(s)] = dump(twin)
        order = _order(run, deps, key)
        again: dict[str, str] = {}
        for s in order:
            for n in _names_in_order(s):
                if n.id in new and n.id not in again:
                    again[n.id] = f"#{lo + len(again)}"
        for s in order:
            for n in ast.walk(s):
                if isinstance(n, ast.Name) and n.id in again:
                    n.id = again[n.id]
        here: _Scope | None = scope
        while here is not None:
            here.renamed = {k: again.get(v, v) for k, v in here.renamed.items()}
            here = here.parent
        return order

    def resolve(self, scope: _Scope | None, name: str) -> str:
        """The name where it is bound: #N in the function-like scope binding it, a module-level
        name as `names` says, else kept."""
        while scope is not None:
            if name in scope.kept:
                return name
            if name in scope.bound and name not in scope.outward:
                return self.name(scope, name)
            scope = scope.parent  # not bound here, or nonlocal: the enclosing function's
        return self.names.glob(name)


# (no call, no `*x` or `in` that would draw from an iterator)
_TRY_STAR = (ast.TryStar,) if hasattr(ast, "TryStar") else ()
_PLAIN = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.BinOp,
          ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Set,
          ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.Eq, ast.NotEq, ast.Lt,
          ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot)


def _assigns_freely(stmt: ast.stmt, scope: _Scope) -> bool:
    """`local = <an expression without calls or scopes>`: runs no code of the package."""
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id in scope.bound and stmt.targets[0].id not in scope.outward
            and all(isinstance(n, _PLAIN) for n in ast.walk(stmt.value)))


def _names_in_order(node: ast.AST) -> list[ast.Name]:
    """Its names in the order the renamer meets them (fields in order, depth first)."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name):
            out.append(n)
        stack += reversed(list(ast.iter_child_nodes(n)))
    return out


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
        bound |= {a.arg for a in _params(node)}
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
