"""Compile a C/C++ operator (d500_operator.h ABI) with the system compiler into a cache under
D500_HOME, rebuilt when the source changes, and call it through ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from d500.errors import D500Error, UsageError
from d500.paths import cache

HEADER = Path(__file__).resolve().parent / "d500_operator.h"
CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".c++", ".C")


class CompileError(D500Error):
    """The compiler rejected an operator's source; `output` holds the compiler's full message."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class TensorStruct(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p)]


class AttributeStruct(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("count", ctypes.c_int64),
                ("ints", ctypes.POINTER(ctypes.c_int64)),
                ("floats", ctypes.POINTER(ctypes.c_double)), ("string", ctypes.c_char_p)]


def command(source: Path, output: Path) -> list[str]:
    """The compiler command line for `source` (C++ by suffix; $CC / $CXX override)."""
    cxx = source.suffix in CXX_SUFFIXES
    compiler = os.environ.get("CXX" if cxx else "CC", "c++" if cxx else "cc")
    std = "-std=c++17" if cxx else "-std=c11"
    return [compiler, std, "-O3", "-march=native", "-fPIC", "-shared", "-Wall",
            f"-I{HEADER.parent}", str(source), "-o", str(output), "-lm"]


@dataclass
class Library:
    """A compiled operator library and its entry points."""

    path: Path
    handle: ctypes.CDLL

    @property
    def has_backward(self) -> bool:
        return hasattr(self.handle, "d500_backward")

    def error(self) -> str:
        if hasattr(self.handle, "d500_error"):
            fn = self.handle.d500_error
            fn.restype = ctypes.c_char_p
            msg = fn()
            return msg.decode(errors="replace") if msg else ""
        return ""


_LOADED: dict[Path, Library] = {}


def build(source: Path) -> Library:
    """The compiled library for `source`, compiling it only when the source (or header) changed."""
    source = Path(source).resolve()
    if not source.is_file():
        raise UsageError(f"{source}: no such file")
    probe = command(source, Path("OUT"))
    digest = hashlib.sha256()
    for part in (source.read_bytes(), HEADER.read_bytes(), " ".join(probe).encode(),
                 *_local_headers(source)):
        digest.update(part)
    out = cache("operators") / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if out in _LOADED:
        return _LOADED[out]
    if not out.exists():
        _compile(source, out)
    try:
        handle = ctypes.CDLL(str(out))
    except OSError as err:
        raise CompileError(f"{source}: compiled library cannot be loaded: {err}") from None
    if not hasattr(handle, "d500_forward"):
        raise UsageError(f"{source}: exports no d500_forward (see d500_operator.h)")
    _LOADED[out] = lib = Library(out, handle)
    return lib


def _local_headers(source: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(source.parent.glob("*.h*")) if p.is_file()]


def _compile(source: Path, out: Path) -> None:
    compiler = command(source, out)[0]
    if shutil.which(compiler) is None:
        raise UsageError(f"{source}: no C/C++ compiler '{compiler}' found (set CC / CXX)")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    proc = subprocess.run(command(source, Path(tmp)), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        text = proc.stderr or proc.stdout
        errors = [ln for ln in text.splitlines() if re.search(r"\berror\b", ln)]
        first = errors[0].strip() if errors else (text.strip().splitlines() or ["?"])[0]
        raise CompileError(f"compiling {source.name} failed ({len(errors)} error(s)): {first}",
                           text)
    os.replace(tmp, out)


def _tensor(array: np.ndarray | None, keep: list[Any]) -> TensorStruct:
    if array is None:
        return TensorStruct(0, -1, None, None)
    from onnx import helper
    shape = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
    keep.extend([array, shape])
    return TensorStruct(helper.np_dtype_to_tensor_dtype(array.dtype), array.ndim,
                        ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                        array.ctypes.data_as(ctypes.c_void_p))


def _attributes(attributes: dict[str, Any], keep: list[Any]):
    items = []
    for name, value in attributes.items():
        ints = floats = string = None
        if isinstance(value, str):
            kind, count, string = 5, len(value.encode()), value.encode()
        elif isinstance(value, (list, tuple)):
            if all(isinstance(v, int) for v in value):
                kind, count, ints = 3, len(value), (ctypes.c_int64 * max(1, len(value)))(*value)
            else:
                kind, count = 4, len(value)
                floats = (ctypes.c_double * max(1, len(value)))(*map(float, value))
        elif isinstance(value, int):
            kind, count, ints = 1, 1, (ctypes.c_int64 * 1)(value)
        else:
            kind, count, floats = 2, 1, (ctypes.c_double * 1)(float(value))
        encoded = name.encode()
        keep.extend([encoded, ints, floats, string])
        items.append(AttributeStruct(
            encoded, kind, count,
            ctypes.cast(ints, ctypes.POINTER(ctypes.c_int64)) if ints is not None else None,
            ctypes.cast(floats, ctypes.POINTER(ctypes.c_double)) if floats is not None else None,
            string))
    array = (AttributeStruct * max(1, len(items)))(*items)
    keep.append(array)
    return array, len(items)


class CKernel:
    """A "c" operator's forward/backward on NumPy arrays."""

    def __init__(self, cls: type, attributes: dict[str, Any]):
        from d500.operators.base import source_path
        self.cls = cls
        self.source = source_path(cls)
        self.library = build(self.source)
        self.attributes = attributes
        self._keep: list[Any] = []
        self._attrs, self._n_attrs = _attributes(attributes, self._keep)
        self._shapes: dict[tuple, list[tuple[np.dtype, tuple[int, ...]]]] = {}

    @property
    def has_backward(self) -> bool:
        return self.library.has_backward

    def _outputs(self, inputs: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        key = tuple((a.dtype.str, a.shape) for a in inputs)
        if key not in self._shapes:
            from d500.operators.reference import infer_outputs
            self._shapes[key] = infer_outputs(self.cls.op_type, self.attributes, inputs,
                                              self.cls.num_outputs, self.cls.opset)
        return [np.empty(shape, dtype) for dtype, shape in self._shapes[key]]

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            detail = self.library.error()
            raise RuntimeError(f"{self.source.name}: {what} returned {status}"
                               f"{': ' + detail if detail else ''}")

    def forward(self, inputs: tuple[Any, ...]) -> tuple[np.ndarray, ...]:
        inputs = tuple(np.ascontiguousarray(a) for a in inputs)
        outputs = self._outputs(inputs)
        keep: list[Any] = []
        ins = (TensorStruct * max(1, len(inputs)))(*[_tensor(a, keep) for a in inputs])
        outs = (TensorStruct * len(outputs))(*[_tensor(a, keep) for a in outputs])
        self._check(self.library.handle.d500_forward(
            self._attrs, self._n_attrs, ins, len(inputs), outs, len(outputs)), "d500_forward")
        return tuple(outputs)

    def backward(self, grad_outputs: tuple, inputs: tuple, outputs: tuple
                 ) -> tuple[np.ndarray | None, ...]:
        inputs = tuple(np.ascontiguousarray(a) for a in inputs)
        outputs = tuple(np.ascontiguousarray(a) for a in outputs)
        grads = [None if g is None else np.ascontiguousarray(g, dtype=o.dtype)
                 for g, o in zip(grad_outputs, outputs)]
        grad_inputs = [np.zeros_like(a) for a in inputs]
        keep: list[Any] = []
        go = (TensorStruct * max(1, len(grads)))(*[_tensor(g, keep) for g in grads])
        ins = (TensorStruct * max(1, len(inputs)))(*[_tensor(a, keep) for a in inputs])
        outs = (TensorStruct * max(1, len(outputs)))(*[_tensor(a, keep) for a in outputs])
        gi = (TensorStruct * max(1, len(grad_inputs)))(*[_tensor(a, keep) for a in grad_inputs])
        self._check(self.library.handle.d500_backward(
            self._attrs, self._n_attrs, go, len(grads), ins, len(inputs), outs, len(outputs),
            gi, len(grad_inputs)), "d500_backward")
        return tuple(None if gi[i].ndim < 0 else g for i, g in enumerate(grad_inputs))
