"""d500's CUDA paths on a machine with an NVIDIA GPU: what runs, what differs from the CPU, speed.

Each stage prints its findings as it goes and a failure in one stage does not stop the next:
1. the environment (GPU, torch, onnxruntime's providers, TensorFlow if installed);
2. training on CUDA: 50 steps of the digits MLP and 20 of LeNet-5, losses against the CPU run
   (the cross-framework bounds, 1e-4 and 1e-3 relative);
   mixed precision (`--only precision`): the digits MLP and a text-lm-shaped transformer in
   bf16 and in fp16 with dynamic loss scaling against fp32, the loss-scale history, step times;
3. the nine light models of the onnx package on CUDA, outputs against the CPU run;
4. level-1 latency of light ResNet-50 at batch 1 on torch CUDA, torch CPU and onnxruntime
   (CPU, and CUDA where its provider is installed), interleaved, medians;
5. a one-rank NCCL process group (the collective DDP would use on GPUs);
6. torch:compiled on CUDA (Inductor's Triton kernels): outputs against eager CUDA, compile time,
   latency beside eager CUDA; its training step's losses against eager CUDA;
7. the JAX backend on CUDA: light models against torch on the CPU, the digits MLP's training
   losses against torch on the CPU, latency;
8. the ONNX node suite on torch with device CUDA, against the CPU's pinned failures;
9. the stage `isolation`, not a CUDA path but the GPU machine's idle CPU cores: issue 17's
   overhead of the judge/worker split on digits-mlp (benchmarks/isolation.py, each run a fresh
   process, then --warm), which this shared 2-core machine is too loaded to resolve to 2 %.

    benchmarks/gpu_check.sh          # on the GPU machine; or, to rehearse here on the CPU:
    .venv/bin/python benchmarks/gpu_check.py --device CPU --quick
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from d500 import backends  # noqa: E402
from d500.builders import build  # noqa: E402

KNOWN = Path(__file__).resolve().parents[1] / "tests" / "backends" / "node_suite_failures"


def stage(title: str):
    """Run one stage under a heading; report its exception and its time, go on either way."""
    def wrap(fn):
        def run(*args):
            print(f"\n== {title}", flush=True)
            t0 = time.perf_counter()
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a check script reports every failure and goes on
                print("FAILED:\n" + traceback.format_exc(limit=6), flush=True)
            print(f"-- {time.perf_counter() - t0:.1f} s", flush=True)
        return run
    return wrap


@stage("environment")
def environment(device: str) -> None:
    import onnx
    import onnxruntime
    import torch
    print(f"python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
          f"torch {torch.__version__} (CUDA build {torch.version.cuda}), "
          f"onnxruntime {onnxruntime.__version__}")
    print(f"torch.cuda.is_available(): {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
    print(f"onnxruntime providers: {onnxruntime.get_available_providers()}")
    print(f"d500 torch backend supports {device}: "
          f"{backends.get('torch').supports_device(device)}; onnxruntime backend: "
          f"{backends.get('onnxruntime').supports_device(device)}")
    try:
        import tensorflow as tf
        print(f"tensorflow {tf.__version__}, GPUs: {tf.config.list_physical_devices('GPU')}")
    except ImportError:
        print("tensorflow: not installed here, its CUDA path is not checked")


def _known(name: str) -> set[str]:
    lines = (KNOWN / f"{name}.txt").read_text().splitlines()
    return {ln.split("#", 1)[0].strip().lstrip("~").strip() for ln in lines} - {""}


@stage("ONNX node suite, torch backend")
def node_suite(device: str, quick: bool) -> None:
    from d500.conformance import backend_test_counts
    pattern = r"test_(conv|gemm|relu|softmax|batchnorm)" if quick else ".*"
    counts = backend_test_counts(backends.get("torch"), pattern=pattern, device=device)
    print(f"{device}: {counts['passed']} passed, {len(counts['failed'])} failed, "
          f"{counts['skipped']} skipped of {counts['run']}")
    suffix = "_" + device.lower()
    known = {t.removesuffix("_cpu") + suffix for t in _known("torch")}
    new = sorted(set(counts["failed"]) - known)
    print(f"failing on {device} but not in the CPU's pinned list ({len(new)}): "
          + (", ".join(new) or "none"))


@stage("light models of the onnx package: CUDA against CPU")
def light_models(device: str, quick: bool) -> None:
    from d500.networks.workloads import find, load
    names = ["light-squeezenet"] if quick else [
        "light-alexnet", "light-densenet121", "light-inception_v1", "light-inception_v2",
        "light-resnet50", "light-shufflenet", "light-squeezenet", "light-vgg19",
        "light-zfnet512"]
    torch_backend = backends.get("torch")
    for name in names:
        model, _ = load(find(name)).onnx_model()
        on_cpu = torch_backend.prepare(model, "CPU")
        feed = _feed(on_cpu)
        cpu = on_cpu.run(feed)[0]
        gpu = torch_backend.prepare(model, device).run(feed)[0]
        rel = float(np.max(np.abs(gpu - cpu)) / max(float(np.max(np.abs(cpu))), 1e-30))
        print(f"{name}: max |CUDA - CPU| / max |CPU| = {rel:.1e}, "
              f"argmax agrees: {bool(np.all(gpu.argmax(-1) == cpu.argmax(-1)))}")


def _feed(exe) -> dict[str, np.ndarray]:
    """Seeded normal data for a prepared model's first graph input (a non-initializer)."""
    name = exe.input_names[0]
    return {name: np.random.default_rng(0).standard_normal(exe.input_shapes[name],
                                                            dtype=np.float32)}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    return (data.images[order] / 16.0).astype(np.float32)[:, None], data.target[order]


@stage("training on CUDA against CPU (momentum SGD, batch 32)")
def training(device: str, quick: bool) -> None:
    from d500.training.optimizers.registry import make
    x, y = _digits()
    for model, steps, bound in (("mlp", 50, 1e-4), ("lenet5", 20, 1e-3)):
        feeds = [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32].astype(
            np.int64)} for i in range(steps)]
        losses = {}
        for dev in ("CPU", device):
            exe = backends.get("torch").prepare(build(model, (1, 8, 8), 10, seed=0, loss=True),
                                                dev)
            trainer = exe.trainer(make("momentum", lr=0.05), loss="loss")
            t0 = time.perf_counter()
            losses[dev] = np.array([trainer.step(f, 0.05) for f in feeds], np.float64)
            print(f"{model} on {dev}: {steps} steps in {time.perf_counter() - t0:.2f} s, "
                  f"loss {losses[dev][0]:.4f} -> {losses[dev][-1]:.4f}")
        rel = float(np.max(np.abs(losses[device] - losses["CPU"]) / np.abs(losses["CPU"])))
        print(f"{model}: max relative loss difference {device}/CPU {rel:.1e} (bound {bound:g}) "
              f"{'ok' if rel <= bound else 'OVER THE BOUND'}")


@stage("a checkpoint of a CUDA trainer restored into a fresh one (adam, digits MLP)")
def checkpoint(device: str, quick: bool) -> None:
    import tempfile

    from d500.training import checkpoint as ckpt
    from d500.training.optimizers.registry import make
    x, y = _digits()
    feeds = [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32].astype(np.int64)}
             for i in range(10)]

    def fresh():
        exe = backends.get("torch").prepare(build("mlp", (1, 8, 8), 10, seed=0, loss=True),
                                            device)
        return exe.trainer(make("adam", lr=0.01), loss="loss")
    saved = fresh()
    for f in feeds[:5]:
        saved.step(f, 0.01)
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        path, digest = ckpt.write(Path(folder), 1, ckpt.capture(saved, 5), {})
        state, _ = ckpt.read(path, digest)
        restored = fresh()
        ckpt.restore(restored, state)
        took = time.perf_counter() - t0
    after = [(restored.step(f, 0.01), saved.step(f, 0.01)) for f in feeds[5:]]
    same = all(a == b for a, b in after)
    print(f"write + read + restore {took * 1e3:.1f} ms; the next 5 losses "
          f"{'equal bit for bit' if same else 'DIFFER'}: {after}")


def scale(name: str, s) -> None:
    """One line on an fp16 run's LossScale (d500.training.precision)."""
    print(f"{name} fp16 loss scale: {s.skipped} of {s.steps} steps skipped; history "
          f"(step, scale) {s.history}; now {s.value:g}")


def _lm_batches(steps: int, batch: int = 16, context: int = 64, vocab: int = 1024
                ) -> list[dict[str, np.ndarray]]:
    """Learnable token windows for text-lm's shape (no corpus: tokenizers is not in the GPU
    image): each window counts up by a stride of its own, so the next token is predictable."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        start = rng.integers(0, vocab, (batch, 1))
        stride = rng.integers(1, 8, (batch, 1))
        tokens = (start + stride * np.arange(context + 1)) % vocab
        out.append({"input": tokens[:, :-1].astype(np.int64),
                    "labels": tokens[:, 1:].astype(np.int64)})
    return out


@stage("mixed precision on CUDA: bf16 and fp16 (dynamic loss scaling) against fp32")
def precision(device: str, quick: bool) -> None:
    import torch

    from d500.builders import build_lm
    from d500.training.optimizers.registry import make
    from d500.training.precision import BF16_LOSS_RTOL, LossScale, loss_gap
    x, y = _digits()
    digits = [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32].astype(
        np.int64)} for i in range(50)]
    cases = [("digits mlp", build("mlp", (1, 8, 8), 10, seed=0, loss=True), digits,
              ("momentum", {"lr": 0.05}), 0.05)]
    if not quick:
        cases.append(("text-lm shape (2 layers, width 64)", build_lm(
            "transformer", 64, 1024, seed=0, loss=True, layers=2, width=64, heads=4, tied=True),
            _lm_batches(30), ("adamw", {"lr": 3e-3}), 3e-3))
    kinds = backends.get("torch").precisions(device)
    print(f"torch trains in {', '.join(kinds)} on {device}")
    for name, model, feeds, (opt, hp), lr in cases:
        losses, times = {}, {}
        for low in ("fp32", "bf16", "fp16"):
            if low not in kinds:
                print(f"{name}: {low} refused on {device} (as it should on a CPU)")
                continue
            trainer = backends.get("torch").prepare(model, device).trainer(
                make(opt, **hp), loss="loss", precision=low)
            trainer.step(feeds[0], lr)  # warm-up (kernels, autocast caches), not timed
            if device.upper().startswith("CUDA"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses[low] = np.array([trainer.step(f, lr) for f in feeds[1:]], np.float64)
            times[low] = (time.perf_counter() - t0) / (len(feeds) - 1)
            print(f"{name} {low}: loss {losses[low][0]:.4f} -> {losses[low][-1]:.4f}, "
                  f"{times[low] * 1e3:.2f} ms/step")
            if trainer.scale is not None:
                scale(name, trainer.scale)
                # again from a scale that overflows at first, with a short growth interval:
                # the backoff and the growth show in the history
                trainer = backends.get("torch").prepare(model, device).trainer(
                    make(opt, **hp), loss="loss", precision=low)
                trainer.scale = LossScale(value=2.0 ** 24, interval=10)
                stressed = [trainer.step(f, lr) for f in feeds]
                scale(f"{name} (from 2^24, interval 10)", trainer.scale)
                print(f"  its losses {stressed[0]:.4f} -> {stressed[-1]:.4f}, all finite: "
                      f"{bool(np.all(np.isfinite(stressed)))}")
        for low in losses:
            if low == "fp32":
                continue
            rel = loss_gap(losses[low], losses["fp32"])
            print(f"{name}: {low}/fp32 largest loss difference {rel:.2e} of the first loss (bound "
                  f"{BF16_LOSS_RTOL:g}) {'ok' if rel <= BF16_LOSS_RTOL else 'OVER THE BOUND'}; "
                  f"step time {low}/fp32 {times[low] / times['fp32']:.2f}")


@stage("level-1 latency, light ResNet-50, batch 1 (interleaved medians)")
def latency(device: str, quick: bool) -> None:
    import onnxruntime
    import torch

    from d500.networks.workloads import find, load
    from d500.timing import measure_interleaved
    model, _ = load(find("light-resnet50")).onnx_model()
    runs = {f"torch {device}": backends.get("torch").prepare(model, device),
            f"torch CPU ({torch.get_num_threads()} threads)": backends.get("torch").prepare(model),
            "onnxruntime CPU": backends.get("onnxruntime").prepare(model)}
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        runs["onnxruntime CUDA"] = backends.get("onnxruntime").prepare(model, "CUDA")
    feed = _feed(runs[f"torch {device}"])
    times = measure_interleaved({k: (lambda e=e: e.run(feed)) for k, e in runs.items()},
                                budget=1.0 if quick else 5.0)
    base = times[f"torch {device}"].median
    for name, t in times.items():
        print(f"{name:34s} median {t.median * 1e3:8.2f} ms over {len(t.samples)} samples "
              f"({t.median / base:.2f}x torch {device})")


@stage("NCCL: a one-rank process group, allreduce on the GPU")
def nccl(device: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print(f"NCCL not available here (cuda {torch.cuda.is_available()}, "
              f"nccl {dist.is_nccl_available()}): not checked")
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.arange(4, dtype=torch.float32, device="cuda")
    dist.all_reduce(t)
    print(f"allreduce over 1 rank: {t.cpu().tolist()} (NCCL {torch.cuda.nccl.version()})")
    dist.destroy_process_group()


@stage("torch:compiled on CUDA: light models against eager CUDA, compile time, latency")
def compiled(device: str, quick: bool) -> None:
    from d500.networks.workloads import find, load
    from d500.timing import measure_interleaved
    for name in ["light-squeezenet"] + ([] if quick else ["light-resnet50"]):
        model, _ = load(find(name)).onnx_model()
        eager = backends.get("torch").prepare(model, device)
        comp = backends.get("torch:compiled").prepare(model, device)
        feed = _feed(eager)
        want = eager.run(feed)[0]
        got = comp.run(feed)[0]
        rel = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        print(f"{name}: compiled/eager on {device}: max rel {rel:.1e}, argmax agrees "
              f"{bool(np.all(got.argmax(-1) == want.argmax(-1)))}, compile "
              f"{comp.compile_time:.1f} s, Inductor's {comp.settings()['wrapper']} wrapper")
        times = measure_interleaved({"eager": lambda: eager.run(feed),
                                     "compiled": lambda: comp.run(feed)},
                                    budget=1.0 if quick else 3.0)
        print(f"{name} b1 on {device}: eager {times['eager'].median * 1e3:.2f} ms, compiled "
              f"{times['compiled'].median * 1e3:.2f} ms "
              f"({times['compiled'].median / times['eager'].median:.2f}x eager)")


@stage("torch:compiled training on CUDA: the digits MLP and LeNet-5 against eager CUDA")
def compiled_training(device: str, quick: bool) -> None:
    from d500.training.optimizers.registry import make
    x, y = _digits()
    for model in ("mlp",) if quick else ("mlp", "lenet5"):
        feeds = [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32].astype(
            np.int64)} for i in range(20)]
        losses, times = {}, {}
        for name in ("torch", "torch:compiled"):
            exe = backends.get(name).prepare(build(model, (1, 8, 8), 10, seed=0, loss=True),
                                             device)
            trainer = exe.trainer(make("momentum", lr=0.05), loss="loss")
            t0 = time.perf_counter()
            losses[name] = np.array([trainer.step(f, 0.05) for f in feeds], np.float64)
            times[name] = time.perf_counter() - t0
        rel = float(np.max(np.abs(losses["torch:compiled"] - losses["torch"])
                           / np.abs(losses["torch"])))
        print(f"{model} 20 steps on {device}: compiled/eager max relative loss difference "
              f"{rel:.1e} (bound 1e-5) {'ok' if rel <= 1e-5 else 'OVER THE BOUND'}; eager "
              f"{times['torch']:.2f} s, compiled {times['torch:compiled']:.2f} s (its compile "
              "included)")


@stage("JAX backend on CUDA: light models and training against torch on the CPU")
def jax_cuda(device: str, quick: bool) -> None:
    import jax

    from d500.networks.workloads import find, load
    from d500.timing import measure_interleaved
    from d500.training.optimizers.registry import make
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    jb = backends.get("jax")
    print(f"d500 jax backend supports {device}: {jb.supports_device(device)}")
    names = ["light-squeezenet"] if quick else ["light-squeezenet", "light-resnet50",
                                                 "light-inception_v1", "light-vgg19"]
    for name in names:
        model, _ = load(find(name)).onnx_model()
        cpu_exe = backends.get("torch").prepare(model, "CPU")
        feed = _feed(cpu_exe)
        want = cpu_exe.run(feed)[0]
        exe = jb.prepare(model, device)
        got = exe.run(feed)[0]
        rel = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        line = (f"{name}: jax {device} against torch CPU: max rel {rel:.1e}, argmax agrees "
                f"{bool(np.all(got.argmax(-1) == want.argmax(-1)))}")
        if name == "light-resnet50":
            t = measure_interleaved({"jax": lambda: exe.run(feed)}, budget=2.0)["jax"]
            line += f"; b1 latency {t.median * 1e3:.2f} ms"
        print(line)
    x, y = _digits()
    feeds = [{"input": x[i * 32:(i + 1) * 32], "labels": y[i * 32:(i + 1) * 32].astype(
        np.int64)} for i in range(50)]
    losses = {}
    for name, dev in (("torch", "CPU"), ("jax", device)):
        exe = backends.get(name).prepare(build("mlp", (1, 8, 8), 10, seed=0, loss=True), dev)
        trainer = exe.trainer(make("momentum", lr=0.05), loss="loss")
        losses[name] = np.array([trainer.step(f, 0.05) for f in feeds], np.float64)
    rel = float(np.max(np.abs(losses["jax"] - losses["torch"]) / np.abs(losses["torch"])))
    print(f"mlp 50 steps: jax {device} against torch CPU, max relative loss difference {rel:.1e} "
          f"(bound 1e-4) {'ok' if rel <= 1e-4 else 'OVER THE BOUND'}")


@stage("the judge/worker split's cost on this machine's idle CPU cores (issue 17)")
def isolation(device: str, quick: bool) -> None:
    import subprocess
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    script = str(Path(__file__).resolve().parent / "isolation.py")
    for warm, pairs in (("", 3 if quick else 8), ("--warm", 2 if quick else 4)):
        subprocess.run([sys.executable, script, "--case", "mlp", "--pairs", str(pairs),
                        "--threads", "1", *filter(None, [warm])], env=env, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CUDA", help="CUDA (default), or CPU to rehearse")
    parser.add_argument("--quick", action="store_true", help="a few node tests and one model")
    parser.add_argument("--skip", default="", help="comma-separated stages to leave out")
    parser.add_argument("--only", default="", help="comma-separated stages to run, no others")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    environment(args.device)
    for name, fn in (("training", training), ("checkpoint", checkpoint),
                     ("precision", precision),
                     ("light", light_models), ("latency", latency),
                     ("nccl", nccl), ("compiled", compiled),
                     ("compiled-training", compiled_training), ("jax", jax_cuda),
                     ("nodes", node_suite), ("isolation", isolation)):  # the longest last
        if name not in skip and (not only or name in only):
            fn(args.device, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
