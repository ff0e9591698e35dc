"""d500's training step against a hand-written training loop in the same framework, interleaved.

d500's side is the workload's network as d500.builders writes it in ONNX (with the loss as a
graph output), translated by the backend, trained through `Executable.trainer(...).step` with the
framework-neutral SGD with momentum. The native side is the same architecture written by hand
with the same initial weights: a torch.nn.Module with torch.optim.SGD (foreach), or a Keras model
(channels-last) with Keras's SGD in one tf.function. Both take the same batches from the same
arrays in memory (NumPy in, the loss out as a Python float, each step), in alternating
repetitions; it prints the throughput ratio d500/native (median over repetitions, with the
quartiles of the per-repetition ratios). Cases: the MLP on digits (8x8, batch 32: per-step
overhead shows) and ResNet-20 on CIFAR-sized input (3x32x32, batch 64: compute-bound).

Both sides share one process, so one's pattern of allocating and freeing activations changes
what the other pays: glibc's malloc hands freed blocks back to the OS (trim, munmap) and the next
step page-faults them in again, 5,000-10,000 faults a step for ResNet-20, landing mostly on
whichever side runs after the other. By default the benchmark asks malloc to keep freed memory
(mallopt: mmap threshold 32 MiB, trim threshold 1 GiB), for both sides alike, as a long training
run's steady state does; --release-memory leaves glibc's defaults.

Batch norm trains alike on both sides: d500's trainers run ResNet-20's BatchNormalization in
training mode (batch statistics; the running mean and variance are buffers updated by momentum,
not parameters: backends/training_graph.py), as the native models do. What d500 does on top, by
the ONNX contract rather than by choice: TensorFlow's side holds kernels in ONNX layout (OIHW)
and the input NCHW, so each step transposes them to channels-last and back.

    .venv/bin/python benchmarks/train_loop.py [--framework both|torch|tensorflow]
        [--case both|mlp|resnet20] [--repetitions 15] [--number N] [--threads 1]
        [--clock wall|cpu] [--release-memory]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from itertools import cycle

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from _args import repetitions
from ratio import interleave, report

LR, MOMENTUM, BATCHES = 0.01, 0.9, 8
CASES = {"mlp": ("mlp", (1, 8, 8), 32), "resnet20": ("resnet20", (3, 32, 32), 64)}
EPS = 1e-5


def data(shape: tuple[int, ...], batch: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """BATCHES batches in memory: real digits for 8x8 input, else seeded noise images."""
    rng = np.random.default_rng(seed)
    n = batch * BATCHES
    if shape == (1, 8, 8):
        from sklearn.datasets import load_digits
        digits = load_digits()
        pick = rng.permutation(len(digits.target))[:n]
        x = (digits.images[pick] / 16.0).astype(np.float32)[:, None]
        y = digits.target[pick].astype(np.int64)
    else:
        x = rng.standard_normal((n, *shape)).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int64)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)]


def weights(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# -- native torch -------------------------------------------------------------------------------
def torch_native(name: str, shape: tuple[int, ...], w: dict[str, np.ndarray]):
    """The builder's network as a plain torch.nn.Module with weights `w` (in eval mode)."""
    import torch
    from torch import nn

    def conv(key: str, stride: int, pad: int) -> nn.Conv2d:
        kernel = w[f"{key}.weight"]
        layer = nn.Conv2d(kernel.shape[1], kernel.shape[0], kernel.shape[2], stride, pad,
                          bias=f"{key}.bias" in w)
        return layer

    def bn(key: str) -> nn.BatchNorm2d:
        return nn.BatchNorm2d(w[f"{key}.scale"].shape[0], eps=EPS)

    if name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 128), nn.ReLU(),
                              nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
        onnx_names = ["fc1", "fc2", "fc3"]
        linears = [m for m in model if isinstance(m, nn.Linear)]
        mapping = {f"{k}.{p}": getattr(m, p) for k, m in zip(onnx_names, linears)
                   for p in ("weight", "bias")}
    else:
        model, mapping = torch_resnet20(conv, bn), {}
        for key, module in model.named_modules():
            if isinstance(module, nn.Conv2d):
                mapping[f"{module.onnx}.weight"] = module.weight
            elif isinstance(module, nn.BatchNorm2d):
                for p, t in (("scale", module.weight), ("bias", module.bias),
                             ("mean", module.running_mean), ("var", module.running_var)):
                    mapping[f"{module.onnx}.{p}"] = t
        mapping["fc1.weight"], mapping["fc1.bias"] = model.fc.weight, model.fc.bias
    with torch.no_grad():
        for key, tensor in mapping.items():
            tensor.copy_(torch.from_numpy(np.array(w[key])))
    assert set(mapping) == set(w), sorted(set(w) ^ set(mapping))
    return model.eval()


class _Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, prefix: str) -> str:
        self.counts[prefix] = self.counts.get(prefix, 0) + 1
        return f"{prefix}{self.counts[prefix]}"


def torch_resnet20(conv: Callable, bn: Callable):
    """ResNet-20 as d500.builders.resnet20 writes it, layer for layer, in torch.nn."""
    import torch
    from torch import nn

    names = _Counter()

    def c(cin_key_stride_pad):
        key, stride, pad = cin_key_stride_pad
        layer = conv(key, stride, pad)
        layer.onnx = key
        return layer

    def b():
        key = names("bn")
        layer = bn(key)
        layer.onnx = key
        return layer

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1, self.bn1 = c((names("conv"), stride, 1)), b()
            self.conv2, self.bn2 = c((names("conv"), 1, 1)), b()
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(c((names("conv"), stride, 0)), b())

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(c((names("conv"), 1, 1)), b(), nn.ReLU())
            blocks, cin = [], 16
            for stage, width in enumerate((16, 32, 64)):
                for i in range(3):
                    blocks.append(Block(cin, width, 2 if stage > 0 and i == 0 else 1))
                    cin = width
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            y = self.blocks(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    return Net()


def torch_case(name: str, shape: tuple[int, ...], batch: int, args) -> tuple[Callable, Callable]:
    import torch
    import torch.nn.functional as F

    from d500.backends import get
    from d500.builders import build
    from d500.training.optimizers.registry import make

    onnx_model = build(name, shape, 10, seed=0, loss=True)
    trainer = get("torch").prepare(onnx_model).trainer(make("momentum", lr=LR,
                                                            momentum=MOMENTUM))
    model = torch_native(name, shape, weights(onnx_model))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, foreach=True)
    batches = data(shape, batch)
    x0, y0 = batches[0]
    with torch.no_grad():
        native_loss = F.cross_entropy(model(torch.from_numpy(x0)), torch.from_numpy(y0)).item()
    d500_loss = float(trainer.predict({"input": x0, "labels": y0}, output="loss"))
    check(name, "torch", d500_loss, native_loss, f"torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    model.train()  # batch statistics while training, as d500's trainer uses them
    d500_batches, native_batches = cycle(batches), cycle(batches)

    def d500_step() -> float:
        x, y = next(d500_batches)
        return trainer.step({"input": x, "labels": y}, LR)

    def native_step() -> float:
        x, y = next(native_batches)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        return loss.item()

    return d500_step, native_step


# -- native TensorFlow / Keras ------------------------------------------------------------------
def keras_native(name: str, shape: tuple[int, ...], w: dict[str, np.ndarray]):
    """The builder's network as a channels-last Keras model with weights `w`."""
    import tensorflow as tf
    layers = tf.keras.layers
    c, h, wd = shape
    inputs = tf.keras.Input((h, wd, c))
    assigned: list[tuple] = []
    names = _Counter()

    if name == "mlp":
        x = layers.Flatten()(inputs)  # C = 1: NHWC and NCHW flatten in the same order
        for i, (units, act) in enumerate(((128, "relu"), (64, "relu"), (10, None)), 1):
            dense = layers.Dense(units, activation=act)
            x = dense(x)
            assigned.append((dense, [w[f"fc{i}.weight"].T, w[f"fc{i}.bias"]]))
        model = tf.keras.Model(inputs, x)
    else:
        def conv(x, stride, pad):
            key = names("conv")
            kernel = w[f"{key}.weight"]
            if pad:
                x = layers.ZeroPadding2D(pad)(x)
            layer = layers.Conv2D(kernel.shape[0], kernel.shape[2], stride, use_bias=False)
            y = layer(x)
            assigned.append((layer, [kernel.transpose(2, 3, 1, 0)]))
            return y

        def bn(x):
            key = names("bn")
            layer = layers.BatchNormalization(epsilon=EPS, momentum=0.9)  # ONNX's default
            y = layer(x)
            assigned.append((layer, [w[f"{key}.{p}"] for p in ("scale", "bias", "mean",
                                                                "var")]))
            return y

        x = layers.ReLU()(bn(conv(inputs, 1, 1)))
        cin = 16
        for stage, width in enumerate((16, 32, 64)):
            for i in range(3):
                stride = 2 if stage > 0 and i == 0 else 1
                y = layers.ReLU()(bn(conv(x, stride, 1)))
                y = bn(conv(y, 1, 1))
                short = bn(conv(x, stride, 0)) if stride != 1 or cin != width else x
                x = layers.ReLU()(layers.Add()([y, short]))
                cin = width
        x = layers.GlobalAveragePooling2D()(x)
        fc = layers.Dense(10)
        x = fc(x)
        assigned.append((fc, [w["fc1.weight"].T, w["fc1.bias"]]))
        model = tf.keras.Model(inputs, x)
    for layer, values in assigned:
        layer.set_weights(values)
    return model


def tensorflow_case(name: str, shape: tuple[int, ...], batch: int, args
                    ) -> tuple[Callable, Callable]:
    import tensorflow as tf

    from d500.backends import get
    from d500.builders import build
    from d500.training.optimizers.registry import make

    onnx_model = build(name, shape, 10, seed=0, loss=True)
    trainer = get("tensorflow").prepare(onnx_model).trainer(
        make("momentum", lr=LR, momentum=MOMENTUM))
    model = keras_native(name, shape, weights(onnx_model))
    optimizer = tf.keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def train(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)  # batch statistics, as d500's trainer
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    batches = data(shape, batch)
    nhwc = [(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), y) for x, y in batches]
    x0, y0 = nhwc[0]
    logits = model(tf.constant(x0), training=False)
    native_loss = float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.constant(y0), logits)))
    d500_loss = float(trainer.predict({"input": batches[0][0], "labels": y0}, output="loss"))
    check(name, "tensorflow", d500_loss, native_loss, f"tensorflow {tf.__version__}")
    d500_batches, native_batches = cycle(batches), cycle(nhwc)

    def d500_step() -> float:
        x, y = next(d500_batches)
        return trainer.step({"input": x, "labels": y}, LR)

    def native_step() -> float:
        x, y = next(native_batches)
        return float(train(tf.constant(x), tf.constant(y)))

    return d500_step, native_step


def check(name: str, framework: str, d500_loss: float, native_loss: float, about: str) -> None:
    """The two sides start from the same function: their initial losses agree."""
    diff = abs(d500_loss - native_loss) / abs(native_loss)
    print(f"{name} on {framework} ({about}): initial loss d500 {d500_loss:.6f}, native "
          f"{native_loss:.6f} (relative difference {diff:.1e})")
    if diff > 1e-4:
        raise SystemExit(f"{name} on {framework}: the two sides compute different losses: "
                         "the comparison would be meaningless")


def keep_memory() -> str:
    """Ask glibc's malloc to keep freed memory (see the module docstring); what was done."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "not glibc: allocator defaults"
    m_trim_threshold, m_mmap_threshold = -1, -3
    if mallopt(m_mmap_threshold, 32 << 20) and mallopt(m_trim_threshold, 1 << 30):
        return "freed memory kept (mmap threshold 32 MiB, trim threshold 1 GiB)"
    return "mallopt refused: glibc defaults"


def calibrate(a: Callable, b: Callable, seconds: float = 0.6) -> int:
    """Steps per timed repetition so that one side's block takes about `seconds`."""
    start = time.perf_counter()
    for _ in range(5):
        a(), b()
    per_step = (time.perf_counter() - start) / 10
    return max(1, round(seconds / per_step))


TARGETS = {("mlp", "torch"): 0.90, ("mlp", "tensorflow"): 0.90,
           ("resnet20", "torch"): 0.98, ("resnet20", "tensorflow"): 0.95}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("both", "torch", "tensorflow"), default="both")
    parser.add_argument("--case", choices=("both", *CASES), default="both")
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=0,
                        help="steps per timed repetition (default: as many as take ~0.6 s)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time (default), or this process's CPU time: steadier on a "
                             "machine other jobs share, with one thread per side")
    parser.add_argument("--release-memory", action="store_true",
                        help="leave glibc malloc's defaults (freed memory goes back to the OS)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads for both sides (default 1: on a shared machine "
                             "other jobs make multi-threaded timings erratic; 0: the default)")
    args = parser.parse_args(argv)
    frameworks = ("torch", "tensorflow") if args.framework == "both" else (args.framework,)
    cases = tuple(CASES) if args.case == "both" else (args.case,)
    if args.threads:
        if "torch" in frameworks:
            import torch
            torch.set_num_threads(args.threads)
        if "tensorflow" in frameworks:
            import tensorflow as tf
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    memory = "glibc defaults" if args.release_memory else keep_memory()
    print(f"malloc: {memory}; {args.threads or 'default'} thread(s) per side")
    results = {}
    for case in cases:
        name, shape, batch = CASES[case]
        for framework in frameworks:
            make_case = torch_case if framework == "torch" else tensorflow_case
            d500_step, native_step = make_case(name, shape, batch, args)
            for _ in range(3):  # warm up: tracing, allocator
                d500_step(), native_step()
            number = args.number or calibrate(d500_step, native_step)
            label = f"{case} batch {batch}, {framework}"
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            results[case, framework] = report(label, *interleave(
                d500_step, native_step, args.repetitions, number, clock), batch)
    print(f"throughput ratio d500/native ({args.clock} clock) against the targets:")
    for (case, framework), ratio in results.items():
        target = TARGETS[case, framework]
        print(f"  {case:<9} {framework:<10} {ratio:.3f}  (target >= {target:.2f}: "
              f"{'met' if ratio >= target else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
