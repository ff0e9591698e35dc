"""Backends by name: the `d500.backends` entry-point group (third parties add theirs there).

A backend is a framework and a mode: `torch` is the torch framework's default mode,
`onnxruntime:basic` onnxruntime's mode `basic`. The entry points register frameworks; each
framework's backend class names its modes (`Backend.modes`), and `get` gives the class of any
of them. The full name is what a run records and what the boards tell apart.
"""

from __future__ import annotations

import ast
import os
import sys
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from d500.errors import D500Error, UsageError, describe, did_you_mean

if TYPE_CHECKING:
    from d500.backends.base import Backend
    from d500.backends.hooks import Framework

# The registration lines, built in; also the entry points in pyproject.toml. A framework is its
# folder (or module), which defines FRAMEWORK (d500.backends.hooks: what d500 knows about it,
# without importing it) and its backend class, plus its one line here.
BUILTIN = {
    "reference": "d500.backends.reference:ReferenceBackend",
    "torch": "d500.backends.torch:TorchBackend",
    "tensorflow": "d500.backends.tensorflow:TensorFlowBackend",
    "onnxruntime": "d500.backends.onnxruntime:OnnxRuntimeBackend",
    "jax": "d500.backends.jax:JaxBackend",
    "openvino": "d500.backends.openvino:OpenVinoBackend",
}


def split(name: str) -> tuple[str, str]:
    """A backend name as (framework, mode): "onnxruntime:basic" -> ("onnxruntime", "basic"),
    "torch" -> ("torch", "") (the framework's default mode)."""
    base, _, mode = name.strip().partition(":")
    return base, mode


# Level 1's judge (`d500 net bench`, `d500 run`) runs a backend that is not d500's own in a host
# process of its own (d500.networks.hosted): once `host_plugins()` is called, this process
# never imports such a backend's module (code there could patch the judge's clock on import).
_hosting = False


def host_plugins() -> None:
    """From now on, in this process: a third-party backend is known by its entry point's
    metadata only (`about`: module and distribution, no hooks), and `get` refuses it (its code
    runs in a host: d500.networks.hosted)."""
    global _hosting
    _hosting = True


def hosted(name: str) -> bool:
    """Whether backend `name` runs in a host of its own here (a third-party one, once
    `host_plugins()` was called)."""
    return _hosting and split(name)[0] not in BUILTIN


def about(name: str) -> Framework | None:
    """What d500 knows about the framework backend `name` (any of its modes) runs on: the
    FRAMEWORK its registered module defines, else (a third-party backend) what its class says;
    None for a backend nobody registered. Imports the framework only for a third-party backend
    without a FRAMEWORK."""
    base = split(name)[0]
    ref = available().get(base)
    if ref is not None and hosted(base):
        return _metadata(base, ref)
    return None if ref is None else _about(base, ref)


@cache
def _metadata(base: str, ref: str) -> Framework:
    """A third-party framework as its entry point's metadata gives it, nothing imported."""
    from d500.backends.hooks import Framework
    dist = next((ep.dist.name for ep in entry_points(group="d500.backends")
                 if ep.name == base and ep.dist is not None), None)
    module = ref.partition(":")[0]
    return Framework(base, module=module, distribution=dist or module.partition(".")[0])


@cache
def _about(base: str, ref: str) -> Framework:
    from d500.backends.hooks import Framework
    module, _, attr = ref.partition(":")
    found = import_module(module)
    known = getattr(found, "FRAMEWORK", None)
    if isinstance(known, Framework):
        return known
    return Framework.of_backend(getattr(found, attr))


def frameworks() -> list[Framework]:
    """What d500 knows about every registered framework that can be imported here (or whose
    FRAMEWORK can), in registration order."""
    found = []
    for name in available():
        try:
            fw = about(name)
        except ImportError:
            continue  # a third-party backend whose framework is missing here
        if fw is not None:
            found.append(fw)
    return found


def trainable() -> list[str]:
    """The registered frameworks that train (their FRAMEWORK names framework-neutral optimizer
    ops), by their default mode's name."""
    return [fw.name for fw in frameworks() if fw.optimizer_ops is not None]


def by_module(module: str) -> Framework | None:
    """The registered framework whose module (or other name: "keras", "optax") is `module`."""
    return next((fw for fw in frameworks() if module in (fw.module, fw.name, *fw.aliases)),
                None)


def framework(name: str) -> tuple[str, str] | None:
    """(import module, distribution) of the framework backend `name` (any of its modes) runs
    on, without importing it; None for a backend nobody registered."""
    try:
        fw = about(name)
    except ImportError:
        return None
    if hosted(name):
        return None  # its host imports it, never this process
    return None if fw is None else (fw.module, fw.distribution)


def quiet_frameworks() -> None:
    """Keep the frameworks' C++ logging (TensorFlow's absl, oneDNN and CPU-feature (AVX) lines)
    off stderr in this process and those it starts, whoever imports them (a backend, a user's
    operator file): TF_CPP_MIN_LOG_LEVEL=3 unless the user set a level of their own. The `d500`
    command calls it first; `import_quietly` too."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def import_quietly(module: str) -> ModuleType:
    """Import a framework module (`tensorflow`, `torch`, ...) with its C++ start-up chatter
    silenced: d500 imports frameworks through here (or through a backend, which does), so none
    prints TensorFlow's absl, oneDNN or CPU-feature lines. Besides `quiet_frameworks`' log level,
    stderr (fd 2) points at /dev/null while the import runs, for what a framework writes before
    its logging is set up. The modules its framework names `hidden` (and this process has not
    imported) are hidden while it loads (the framework guards each with ImportError); they
    import as usual afterwards."""
    quiet_frameworks()
    if module in sys.modules:
        return sys.modules[module]
    fw = by_module(module)
    hidden = [name for name in (fw.hidden if fw else ()) if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        return import_module(module)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


def import_frameworks_of(source: Path) -> None:
    """Import, quietly, every registered framework a user's Python file imports at its top
    level, before the file runs: a framework that logs through absl before its log level is
    read (TensorFlow 2.21 on a CPU with AVX-512 VNNI/BF16, where oneDNN is on: "All log messages
    before absl::InitializeLog()", "oneDNN custom operations are on") ignores
    TF_CPP_MIN_LOG_LEVEL, so only `import_quietly`'s muted stderr keeps it off the user's
    screen. A file that cannot be read or parsed is left to its importer to report."""
    try:
        tree = ast.parse(Path(source).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return
    named = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            named.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named.add(node.module.partition(".")[0])
    for module in sorted(named):
        fw = by_module(module)
        if fw is not None:
            try:
                import_quietly(fw.module)
            except ImportError:
                continue  # the file's own import says what is missing; the others still load


def import_user_file(path: Path, module_name: str) -> ModuleType | None:
    """A user's Python file run as the module `module_name` (kept in sys.modules, where
    dataclasses and pickling look it up), the frameworks it imports imported first
    (import_frameworks_of); None where Python cannot import it as a file. An exception its code
    raises is raised, the module taken out of sys.modules first."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        import_frameworks_of(path)
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[module_name]
        raise
    return module


def available() -> dict[str, str]:
    """Every known framework's backend name (its default mode) -> 'module:Class'."""
    found = dict(BUILTIN)
    for ep in entry_points(group="d500.backends"):
        found.setdefault(ep.name, ep.value)
    return found


def installed() -> list[str]:
    """Names of the backends whose framework can be imported here, each framework's default
    mode (what runs when no backend is named; its other modes run when named)."""
    return [name for name in available() if is_installed(name)]


def is_installed(name: str) -> bool:
    """Whether the framework of backend `name` (any mode, not checked) can be imported here."""
    from importlib.util import find_spec
    base = split(name)[0]
    if base not in available():
        return False
    try:
        module = framework(base)
        return module is None or find_spec(module[0]) is not None
    except (ImportError, ValueError):
        return False


def modes() -> dict[str, tuple[str, bool]]:
    """Every mode of every known backend: full name -> (one line on what it is, installed),
    from each framework's FRAMEWORK (`about`, `modes`): no framework is imported. A third-party
    backend that declares them on its class alone is described by its class (imported)."""
    found: dict[str, tuple[str, bool]] = {}
    for name in available():
        try:
            fw = about(name)
        except Exception as err:  # noqa: BLE001 - a backend whose module fails is listed so
            found[name] = (f"cannot be imported here: {describe(err)}", False)
            continue
        here = is_installed(name)
        lines = {name: fw.about, **{f"{name}:{mode}": line for mode, line in fw.modes.items()}}
        if here and not (fw.about or fw.modes):  # a FRAMEWORK that leaves them to its class
            try:
                lines = get(name).mode_names()
            except Exception as err:  # noqa: BLE001 - a framework that fails to import
                lines, here = {name: f"cannot be imported here: {describe(err)}"}, False
        found.update({full: (line, here) for full, line in lines.items()})
    return found


def version(name: str) -> str | None:
    """The installed version of the distribution backend `name` runs on, read from its
    metadata (the framework is not imported); None where it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version
    fw = about(name)
    try:
        return None if fw is None else installed_version(fw.distribution)
    except PackageNotFoundError:
        return None


def select(text: str | None) -> list[str]:
    """A comma list of backend names as a user gives it (`--backends a,b`), each checked to be
    known; None (not given): every installed backend; "" is empty, as "," is (`--backends "$B"`
    with B unset ran every backend)."""
    if text is None:
        return installed()
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--backends is empty")
    known = available()
    for name in names:
        base, mode = split(name)
        if base not in known:
            raise unknown(name)
        if mode and is_installed(base) and not hosted(base):
            get(name)  # an unknown mode fails here, in one line naming the framework's modes
    return list(dict.fromkeys(names))


def unknown(name: str) -> UsageError:
    """The error for a backend name nobody registered: the known frameworks, and the mode
    the name is closest to when one is (a typo: 'torc', 'onnxruntime:basci')."""
    hint = did_you_mean(name, modes())
    hint = f"; {hint}" if hint else ""
    return UsageError(f"unknown backend '{name}' (known: {', '.join(available())}; their modes: "
                      f"d500 backends{hint})")


def get(name: str) -> type[Backend]:
    """The backend class of `name` ("framework" or "framework:mode"); imports its framework
    now. An unknown framework or mode is a UsageError naming the known ones."""
    known = available()
    base, mode = split(name)
    if base not in known:
        raise unknown(name)
    if hosted(base):
        raise D500Error(f"backend '{name}' is not d500's own: it runs in a host process of its "
                        f"own here (d500.networks.hosted), never imported by the judge")
    module, _, attr = known[base].partition(":")
    imported = framework(base)
    if imported is not None and imported[0] not in sys.modules:  # said before its import
        from d500 import progress  # holds the interpreter for seconds (torch 1-4 s)
        progress.step(f"loading {base}")
    try:
        cls = getattr(import_module(module), attr)
    except ImportError as err:
        raise UsageError(f"backend '{name}' is not installed here ({err.name or err}); "
                         f"install d500[{base}]") from err
    if ":" in name and not mode:
        raise UsageError(f"backend '{name}' names no mode (the modes of {base}: "
                         f"{', '.join(cls.mode_names())})")
    return cls.in_mode(mode)
