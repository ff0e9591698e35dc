"""OpenVINO as an inference-only peer backend, beside onnxruntime: it reads the ONNX model
directly (its ONNX front end) and compiles it for the CPU plugin.

Two modes, which differ in the precision OpenVINO computes float32 tensors in:
- `openvino`: INFERENCE_PRECISION_HINT pinned to f32. On a CPU with bfloat16 units
  (avx512_bf16, AMX) OpenVINO's own default is bf16, whose outputs disagree with the reference
  by ~3e-3 of their scale on a ResNet-50: above the float32 tolerance (1e-3), so this mode pins
  f32 and is judged as float32.
- `openvino:bf16`: the hint bf16, judged at bfloat16's tolerance (d500.tolerances.network).
  A CPU without bfloat16 units runs it in f32 all the same (OpenVINO falls back silently):
  `settings()` says which precision ran, and a level-1 run records it.

The thread count is the one every framework gets (d500.threads, `--threads`), as
INFERENCE_NUM_THREADS, with one stream and the latency hint (one request at a time, as d500
times every backend) and no CPU pinning (as no other framework is pinned).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import numpy as np
import onnx

from d500 import threads
from d500.backends.base import Backend, Executable, InferenceOnly
from d500.backends.hooks import Framework
from d500.errors import ModelError, UnsupportedOperator

# mode -> (OpenVINO's inference precision hint, the dtype d500 judges the outputs at: None for
# the model's own)
PRECISION: dict[str, tuple[str, str | None]] = {"": ("f32", None), "bf16": ("bf16", "bfloat16")}
# "-- No conversion rule found for operations: NoSuchOp-28, com.x.Foo"
_NO_RULE = re.compile(r"No conversion rule found for operations?: ([^\n]+)")
_OP = re.compile(r"^(?:(?P<domain>[\w.]+)\.)?(?P<op>[A-Za-z]\w*?)(?:-(?P<opset>\d+))?$")


@cache
def core() -> Any:
    """One OpenVINO Core per process (making one loads its plugins)."""
    from d500.backends import import_quietly
    return import_quietly("openvino").Core()


def _as_input(x: Any) -> np.ndarray:
    """A C-contiguous array of the input's shape (np.ascontiguousarray would make a scalar 1-d,
    which OpenVINO refuses for a rank-0 input)."""
    a = np.asarray(x)
    return a if a.flags.c_contiguous else a.copy(order="C")


# Each compiled model gets threads.recorded()'s count as its INFERENCE_NUM_THREADS.
FRAMEWORK = Framework(
    "openvino", module="openvino", distribution="openvino",
    # `import openvino` sends Intel a usage event (openvino_telemetry, consent presumed where
    # no opt-out file exists) from a forked child: a fork of the judge mid-run (JAX warns of a
    # deadlock) and a network call; hidden, OpenVINO takes its own no-op stub
    hidden=("openvino_telemetry",),
    about="OpenVINO's CPU plugin on the ONNX model, inference precision pinned to f32; "
          "inference only",
    modes={"bf16": "OpenVINO's CPU plugin at the inference precision bf16 (f32 where the CPU "
                   "has no bf16 units), judged at bfloat16's tolerance; inference only"})


class OpenVinoExecutable(InferenceOnly):
    backend_name = "openvino"

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", mode: str = ""):
        super().__init__(model, device)
        self.hint, self.precision = PRECISION[mode]
        try:
            read = core().read_model(model.SerializeToString())
        except RuntimeError as err:
            raise self._error(model, str(err)) from None
        # No CPU pinning (OpenVINO's default on Linux pins its threads to cores): d500 pins no
        # other framework, and a pinned thread on a shared machine waits for its one core (a
        # 64x128 Gemm's 90th percentile went 2-3 ms pinned against 0.2 ms unpinned here).
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.hint,
                                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                                  "ENABLE_CPU_PINNING": False}
        count = (threads.recorded() or {}).get("count")
        if count:  # the one count every framework gets (--threads)
            config["INFERENCE_NUM_THREADS"] = int(count)
        try:
            self._compiled = core().compile_model(read, "CPU", config)
        except RuntimeError as err:
            raise self._error(model, str(err)) from None
        self._request = self._compiled.create_infer_request()
        # OpenVINO's ports carry the ONNX tensor names; the outputs in graph-output order
        ports = {name: k for k, port in enumerate(self._compiled.outputs)
                 for name in port.get_names()}
        missing = [n for n in self.output_names if n not in ports]
        if missing:
            raise ModelError(f"model '{model.graph.name}': OpenVINO compiled it without the "
                             f"output(s) {', '.join(missing)}")
        self._outputs = [ports[n] for n in self.output_names]
        self._inputs = {name for port in self._compiled.inputs for name in port.get_names()}

    @staticmethod
    def _error(model: onnx.ModelProto, text: str) -> Exception:
        """OpenVINO's refusal as an UnsupportedOperator where it names an operator it lacks."""
        if m := _NO_RULE.search(text):
            first = m.group(1).split(",")[0].strip()
            if parsed := _OP.match(first):
                op, domain = parsed.group("op"), parsed.group("domain") or ""
                node = next((n for n in model.graph.node if n.op_type == op
                             and n.domain in (domain, "ai.onnx" if not domain else domain)),
                            None)
                opset = next((o.version for o in model.opset_import
                              if o.domain in ((domain,) if domain else ("", "ai.onnx"))), 1)
                return UnsupportedOperator(op, domain, opset, node.name if node else "",
                                           "openvino")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()
                 and not ln.startswith(("Exception from", "Check '"))]
        first = " ".join(lines)[:300] or "no reason given"
        return ModelError(f"model '{model.graph.name}': OpenVINO cannot load it: {first}")

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        feeds = {k: _as_input(v) for k, v in self.bind(inputs).items() if k in self._inputs}
        # a synchronous call: the request may read the inputs in place and lend its outputs,
        # which are copied once here (the next call overwrites them)
        results = self._request.infer(feeds, share_inputs=True, share_outputs=True)
        return [np.array(results[k]) for k in self._outputs]

    @property
    def native(self) -> Any:
        return self._compiled

    def settings(self) -> dict[str, Any]:
        hint = self._compiled.get_property("INFERENCE_PRECISION_HINT")  # an openvino.Type
        ran = hint.to_string() if hasattr(hint, "to_string") else str(hint)
        found = {"inference_precision": ran, "requested_precision": self.hint,
                 "num_threads": int(self._compiled.get_property("INFERENCE_NUM_THREADS")),
                 "performance_hint": str(self._compiled.get_property("PERFORMANCE_HINT")),
                 "cpu_pinning": bool(self._compiled.get_property("ENABLE_CPU_PINNING"))}
        if ran != self.hint:
            found["note"] = (f"OpenVINO runs {ran}, not the requested {self.hint}: this CPU "
                             f"lacks {self.hint} units")
        return found


class OpenVinoBackend(Backend):
    name = "openvino"
    trainable = False
    about = FRAMEWORK.about
    modes = FRAMEWORK.modes

    @classmethod
    def precision(cls) -> str | None:
        return PRECISION[cls.mode][1]

    @classmethod
    def _prepare(cls, model: onnx.ModelProto, device: str, **kwargs: Any) -> Executable:
        return OpenVinoExecutable(model, device, cls.mode)
