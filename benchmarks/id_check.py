"""What the call check adds to a call of a token-id model by itself (level 1, d500.networks.hosted):
the shift of its ids (level 0's add of a window of the pattern, then mod the vocabulary) and the
checksums of its outputs (a step's loss and gradients), against the call it checks, on a
workload's calls (text-lm: latency at batch 1, a pass and a training step at the workload's
batch) with the reference backend, 1 thread. The check alone runs the same round-trip loop
(d500.operators.host._checked_calls) over an executable that answers each call with outputs
computed once, so it times the check and nothing else; the plain calls and the check alone
alternate round by round. It prints the medians per call and check / call, the check's share
of a checked call (hosted_backend.py's checked / plain, which its noise hides on text-lm).

    .venv/bin/python benchmarks/id_check.py [--rounds 15] [--workload text-lm]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from typing import Any

import numpy as np

from d500 import threads
from d500.backends import get
from d500.networks import bench, workloads
from d500.networks.hosted import CallRunner, _ordered, _prepare
from d500.operators.host import _checked_calls


class Answered:
    """An executable that answers every call with the outputs its first call gave."""

    def __init__(self, exe: Any, kind: str, feeds: dict[str, np.ndarray], how: dict[str, Any]):
        self.parameter_names = getattr(exe, "parameter_names", [])
        if kind == "forward":
            self.outs = exe.run(feeds)
        else:
            self.outs, self.grads = exe.gradients(feeds, **how)

    def run(self, feeds: dict[str, np.ndarray]) -> Any:
        return self.outs

    def gradients(self, feeds: dict[str, np.ndarray], **how: Any) -> Any:
        return self.outs, self.grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--workload", default="text-lm")
    args = parser.parse_args()
    threads.configure(1, ["numpy"])
    wl = workloads.load(workloads.find(args.workload))
    model, path = wl.onnx_model()
    feeds1, feeds_b = bench.bench_inputs(wl, model)
    train_model, train_path = bench.training_model(wl, model, path)
    exe, step = get("reference").prepare(str(path)), get("reference").prepare(str(train_path))
    how = {"output": wl.loss_output, "wrt": list(step.parameter_names)}
    cases = [("latency, batch 1", exe, model, "forward", feeds1, {}),
             (f"pass, batch {wl.batch_size}", exe, model, "forward", feeds_b, {}),
             (f"training step, batch {wl.batch_size}", step, train_model, "step",
              bench.training_inputs(wl, train_model), how)]
    print(f"{wl.name}, reference backend, {args.rounds} rounds, 1 thread")
    print(f"{'call':<26}{'shifted':>16}{'call':>12}{'check':>10}{'check/call':>22}")
    for label, real, graph, kind, feeds, kw in cases:
        names, inputs, vocab = _ordered(feeds, graph)
        state = {"run": CallRunner(Answered(real, kind, feeds, kw), kind, names,
                                   kw.get("output"), kw.get("wrt"), vocab)}
        _prepare(state, inputs, secrets.randbits(63))
        scale = 2.0 * vocab if vocab is not None else None  # as CheckedCall sizes ids
        if scale is None:
            print(f"{label:<26}{'no ids':>16}")
            continue
        plain = CallRunner(real, kind, names, kw.get("output"), kw.get("wrt"))
        calls = max(1, round(0.05 / _took(lambda: plain.call(inputs))))
        calls_c = max(1, round(0.05 / _took(lambda: _checked_calls(
            state["run"], state["checked forward"], 1, 0, scale))))
        one, check = [], []
        for r in range(args.rounds):
            def here() -> None:
                one.append(_took(lambda: [plain.call(inputs) for _ in range(calls)]) / calls)

            def checked() -> None:
                seed = secrets.randbits(63)
                check.append(_took(lambda: _checked_calls(
                    state["run"], state["checked forward"], calls_c, seed, scale)) / calls_c)
            for fn in ([here, checked] if r % 2 == 0 else [checked, here]):
                fn()
        ratios = [c / o for c, o in zip(check, one)]
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        print(f"{label:<26}{names[0] + ' mod ' + str(vocab):>16}"
              f"{statistics.median(one) * 1e3:>10.2f}ms{statistics.median(check) * 1e6:>8.1f}us"
              f"{statistics.median(ratios):>9.4f} [{q[0]:.4f}, {q[2]:.4f}]")


def _took(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
