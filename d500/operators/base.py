"""CustomOperator, the level-0 operator interface, and loading an operator from `FILE.py:Class`.

An operator implements one ONNX operator (default domain) in NumPy, PyTorch, TensorFlow, JAX or
C/C++.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from d500.backends import import_user_file
from d500.errors import UsageError, did_you_mean, listed

C = "c"  # an operator in C/C++ (d500 compiles it), beside the registered frameworks


def frameworks() -> list[str]:
    """What an operator's `framework` may be: the module of every registered framework that runs
    operators (its FRAMEWORK's `operator_runner`: numpy, torch, tensorflow, jax), and "c"."""
    from d500 import backends
    return [*(fw.module for fw in backends.frameworks() if fw.operator_runner), C]


def autograd(framework: str) -> bool:
    """Whether d500 differentiates an operator's forward in `framework` when it has no backward
    (its FRAMEWORK's `autograd`: torch, tensorflow, jax)."""
    from d500 import backends
    fw = backends.by_module(framework)
    return fw is not None and fw.autograd


class CustomOperator:
    """Subclass this to implement one ONNX operator.

    class MyConv(CustomOperator):
        op_type = "Conv"         # the ONNX operator whose semantics it implements
        framework = "numpy"      # "numpy" | "torch" | "tensorflow" | "jax" | "c"
        def __init__(self, **attributes): ...           # the node's attributes
        def forward(self, *inputs): ...                 # an array, or a tuple of arrays
        def backward(self, grad_outputs, inputs, outputs): ...  # one gradient per input

    numpy operators take and return NumPy arrays; torch/tensorflow/jax operators take and return
    framework tensors (without `backward`, their gradient is the framework's autograd; a jax
    operator's forward is jitted by d500, so it must be traceable, its attributes Python values,
    and its backward becomes a jax.custom_vjp rule). A "c"
    operator sets `source` to a C/C++ file implementing d500_operator.h (relative to the Python
    file) and `num_outputs`; d500 compiles it and supplies forward/backward.
    """

    op_type: ClassVar[str] = ""
    framework: ClassVar[str] = "numpy"
    opset: ClassVar[int | None] = None       # default: d500.operators.reference.DEFAULT_OPSET
    source: ClassVar[str | None] = None      # framework "c": the C/C++ source file
    num_outputs: ClassVar[int] = 1           # framework "c": how many outputs forward fills

    def __init__(self, **attributes: Any):
        self.attributes = dict(attributes)
        if self.framework == "c":
            from d500.operators.compile import CKernel
            self._kernel = CKernel(type(self), self.attributes)

    def forward(self, *inputs: Any) -> Any:
        if self.framework == "c":
            return self._kernel.forward(inputs)
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, grad_outputs: tuple, inputs: tuple, outputs: tuple) -> tuple:
        if self.framework == "c" and self._kernel.has_backward:
            return self._kernel.backward(grad_outputs, inputs, outputs)
        raise NotImplementedError(f"{type(self).__name__}.backward")

    @classmethod
    def has_backward(cls) -> bool:
        """Whether the operator supplies its own backward (a C operator: if it exports one)."""
        if cls.framework == "c":
            from d500.operators.compile import build
            return build(source_path(cls)).has_backward
        return cls.backward is not CustomOperator.backward


def source_path(cls: type) -> Path:
    """The C/C++ source of a "c" operator, relative to the file that defines the class."""
    if getattr(cls, "source_file", None):  # a class in an operator host (d500.operators.host)
        return Path(cls.source_file)
    if not cls.source:
        raise UsageError(f"operator {cls.__name__} has framework 'c' but no `source` file")
    path = Path(inspect.getfile(cls)).resolve().parent / cls.source
    if not path.is_file():
        raise UsageError(f"operator {cls.__name__}: source file {path} not found")
    return path


@dataclass
class Loaded:
    """An operator class with where it came from: its file(s) and its entry's name."""

    cls: type[CustomOperator]
    file: Path
    submission: str
    files: list[Path] = field(default_factory=list)
    workloads: list[str] | None = None
    submission_file: Path | None = None


def load(spec: str, isolated: bool = False) -> Loaded:
    """`FILE.py:Class`, or a submission folder / submission.yaml naming one (or the name of one
    of d500's example entries, d500.paths.entry), loaded; `isolated`: in an operator host
    process, as the judge loads entries (`load_class`)."""
    from d500.paths import entry
    spec = entry(spec)
    path = Path(spec)
    if ":" not in spec or path.is_dir() or path.name == "submission.yaml":
        if path.is_dir():
            path = path / "submission.yaml"
        if path.name == "submission.yaml":
            from d500.operators.workloads import load_submission
            sub = load_submission(path)
            loaded = load_class(sub["operator_file"], sub["operator_class"], isolated)
            loaded.submission = sub["name"]
            loaded.workloads = sub["workloads"]
            loaded.submission_file = path.resolve()
            loaded.files.append(path.resolve())
            return loaded
        if "/" not in spec and os.sep not in spec and not path.exists():  # a bare name
            from d500.paths import no_entry
            raise UsageError(f"{no_entry(spec)}; or give FILE.py:Class")
        if path.is_file() and path.suffix == ".py":
            raise UsageError(f"'{spec}': name the operator class in it too ({spec}:Class)")
        if path.is_file() and path.suffix in (".yaml", ".yml"):  # a case file, first
            raise UsageError(f"'{spec}': a YAML file where the operator goes (FILE.py:Class or "
                             f"a submission folder); a case file goes after --case")
        missing = "" if path.exists() else "no such file or folder; "
        raise UsageError(f"'{spec}': {missing}expected FILE.py:Class or a submission folder")
    file, _, name = spec.rpartition(":")
    return load_class(Path(file), name, isolated)


def load_class(file: Path, name: str, isolated: bool = False) -> Loaded:
    """Import `file` and return its CustomOperator subclass `name`; `isolated`: import and run
    it in an operator host process (d500.operators.host), never in this one."""
    file = Path(file)
    if not file.is_file():
        from d500.paths import looked_in
        raise UsageError(f"{file}: no such file{looked_in(file)}")
    if not name.isidentifier():
        raise UsageError(f"'{name}' is not a class name (expected FILE.py:Class)")
    cls = _host_class(file, name) if isolated else _class(file, name)
    files = [file.resolve()]
    if cls.framework == "c":
        files.append(source_path(cls))
    sub_yaml = file.resolve().parent / "submission.yaml"
    submission = name
    if sub_yaml.is_file():
        from d500.operators.workloads import load_submission
        sub = load_submission(sub_yaml)
        if sub["operator_file"] == file.resolve() and sub["operator_class"] == name:
            return Loaded(cls, file.resolve(), sub["name"], files + [sub_yaml],
                          sub["workloads"], sub_yaml)
    return Loaded(cls, file.resolve(), submission, files)


def _host_class(file: Path, name: str) -> Any:
    from d500.operators.host import RemoteClass
    return RemoteClass.start(file, name)


def _class(file: Path, name: str) -> type[CustomOperator]:
    """The class `name` of `file`, imported here and checked."""
    module = _import(file.resolve())
    cls = getattr(module, name, None)
    if cls is None:
        found = [k for k, v in vars(module).items() if isinstance(v, type)
                 and issubclass(v, CustomOperator) and v is not CustomOperator]
        raise UsageError(f"{file}: no class '{name}' (operators found there: "
                         f"{', '.join(found) or 'none'})")
    if not (isinstance(cls, type) and issubclass(cls, CustomOperator)):
        raise UsageError(f"{file}: '{name}' is not a subclass of d500.operators.CustomOperator")
    check_class(cls, file)
    return cls


def check_class(cls: type[CustomOperator], file: Path | str) -> None:
    """The class names a known ONNX operator and framework, and defines its forward."""
    import onnx.defs
    allowed = frameworks()
    if cls.framework not in allowed:
        raise UsageError(f"{file}: {cls.__name__}.framework is '{cls.framework}' "
                         f"(allowed: {listed(cls.framework, allowed)})")
    if not cls.op_type or not onnx.defs.has(cls.op_type):
        hint = operator_hint(cls.op_type)
        raise UsageError(f"{file}: {cls.__name__}.op_type '{cls.op_type}' is not an ONNX "
                         f"operator of the default domain" + (f" ({hint})" if hint else ""))
    if cls.framework != "c" and cls.forward is CustomOperator.forward:  # it failed every case
        raise UsageError(f"{file}: {cls.__name__} defines no forward(self, *inputs), which a "
                         f"{cls.framework} operator must (only a C operator's is its source's)")


def operator_hint(op_type: str) -> str:
    """did you mean the closest default-domain ONNX operator to a mistyped `op_type` ('')."""
    import onnx.defs
    ops = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})
    return did_you_mean(op_type, ops)


def _import(file: Path):
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    try:
        module = import_user_file(file, f"d500_user_operator_{file.stem}_{digest}")
    except SyntaxError as err:
        raise UsageError(f"{err.filename}:{err.lineno}: SyntaxError: {err.msg}") from None
    except Exception as err:  # noqa: BLE001 - any import-time failure of user code is bad input
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise UsageError(f"{file}: importing it failed at {Path(frame.filename).name}:"
                         f"{frame.lineno}: {type(err).__name__}: {err}") from None
    if module is None:
        raise UsageError(f"{file}: not a Python file")
    return module
