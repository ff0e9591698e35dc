"""d500's torch backend against native PyTorch on the same ResNet-style CNN, interleaved.

A ResNet-style CNN is built natively in torch, exported to ONNX (torch.onnx.export), prepared by
d500's torch backend with the same weights, and both are timed on the same input in alternating
repetitions: inference (forward under inference mode) and a training step's forward+backward
(gradients of the summed logits with respect to every parameter and the input). It prints the
throughput ratio d500/native (median over repetitions, with the quartiles of the per-repetition
ratios) for the module level (torch tensors in and out) and the Executable API (NumPy in and out).

    .venv/bin/python benchmarks/torch_vs_native.py [--batch 32] [--repetitions 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings

import numpy as np
import torch
from _args import repetitions
from ratio import interleave, report
from torch import nn


class Block(nn.Module):
    """A basic residual block: two 3x3 conv-BN layers, an identity or 1x1-conv shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-14 style for 32x32x3 inputs: a stem, three stages of two blocks, pool, classifier."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def build(batch: int, seed: int = 0):
    """The native model (eval mode, trained-looking BN statistics), its ONNX export and an input."""
    import onnx
    torch.manual_seed(seed)
    model = ResNet()
    with torch.no_grad():  # non-trivial running statistics, so BN is not an identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(batch, 3, 32, 32)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # TrainingMode.PRESERVE keeps BatchNormalization nodes (EVAL would fold them into the
        # convolutions, and d500 would then run fewer operators than native torch).
        torch.onnx.export(model, (x,), buffer, input_names=["input"], output_names=["logits"],
                          opset_version=17, dynamo=False, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE,
                          dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    return model, onnx.load_from_string(buffer.getvalue()), x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repetitions", type=repetitions, default=20)
    parser.add_argument("--number", type=int, default=5, help="calls per timed repetition")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both sides (default 1: on a shared machine "
                             "other jobs make multi-threaded timings erratic; 0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from d500.backends.torch import TorchBackend

    model, onnx_model, x = build(args.batch)
    rep = TorchBackend.prepare(onnx_model)
    module = rep.native
    x_np = x.numpy()

    with torch.inference_mode():  # same weights, same outputs
        expected = model(x).numpy()
    got = rep.run([x_np])[0]
    err = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) + 1e-12))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{len(onnx_model.graph.node)} ONNX nodes; max relative output difference {err:.2e}")
    if err > 1e-4:
        print("outputs differ: the comparison would be meaningless", file=sys.stderr)
        return 1

    def native_infer():
        with torch.inference_mode():
            return model(x)

    def d500_infer():
        with torch.inference_mode():
            return module(x)

    native_params = list(model.parameters())
    d500_params = list(module.parameters())

    def native_train():
        xg = x.detach().requires_grad_(True)
        return torch.autograd.grad(model(xg).sum(), native_params + [xg])

    def d500_train():
        xg = x.detach().requires_grad_(True)
        return torch.autograd.grad(module(xg)[0].sum(), d500_params + [xg])

    for fn in (native_infer, d500_infer, native_train, d500_train):  # warm up
        fn()
    reps, number = args.repetitions, args.number
    ratios = {
        "inference (module)": report("inference (module)", *interleave(
            d500_infer, native_infer, reps, number), args.batch),
        "forward+backward (module)": report("forward+backward (module)", *interleave(
            d500_train, native_train, reps, number), args.batch),
        "inference (Executable.run)": report("inference (Executable.run, NumPy)", *interleave(
            lambda: rep.run([x_np]), native_infer, reps, number), args.batch),
        "forward+backward (gradients)": report(
            "forward+backward (gradients, NumPy)", *interleave(
                lambda: rep.gradients([x_np]), native_train, reps, number), args.batch),
    }
    worst = min(ratios.values())
    print(f"lowest ratio {worst:.3f} (target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
