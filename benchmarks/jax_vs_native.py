"""d500's JAX backend against native JAX on the same ResNet-style CNN, interleaved.

A ResNet-14-style CNN is written twice from one set of weights: as plain JAX (channels-last,
HWIO kernels, as Flax writes convolutions; `jax.lax.conv_general_dilated`, batch norm in
inference form) and as ONNX (NCHW, OIHW, as ONNX is), which d500's JAX backend prepares. Both are
jitted and run on the same input (NHWC for native, its NCHW transpose for d500) in alternating
repetitions: inference, and forward+backward (jax.grad of the summed logits with respect to every
parameter and the input). It prints the throughput ratio d500/native (median over repetitions,
quartiles of the per-repetition ratios) over JAX arrays, and at the Executable API (`run` and
`gradients`, NumPy in and out; the native side then also returns NumPy arrays).

    .venv/bin/python benchmarks/jax_vs_native.py [--batch 32] [--repetitions 15]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from _args import repetitions
from onnx import TensorProto, helper, numpy_helper
from ratio import agree, compare

WIDTHS = (16, 32, 64)
EPS = 1e-5


def layers() -> list[tuple[str, int, int, int, int]]:
    """Every conv-BN of the network: (name, in channels, out channels, kernel, stride)."""
    found, cin = [("stem", 3, WIDTHS[0], 3, 1)], WIDTHS[0]
    for i, width in enumerate(WIDTHS):
        stride = 1 if i == 0 else 2
        found += [(f"s{i}a_1", cin, width, 3, stride), (f"s{i}a_2", width, width, 3, 1)]
        if stride != 1 or cin != width:
            found.append((f"s{i}a_sc", cin, width, 1, stride))
        found += [(f"s{i}b_1", width, width, 3, 1), (f"s{i}b_2", width, width, 3, 1)]
        cin = width
    return found


def weights(seed: int = 0, classes: int = 10) -> dict[str, np.ndarray]:
    """The weights, ONNX layout (OIHW), with trained-looking batch-norm statistics."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, cin, cout, k, _ in layers():
        w[f"{name}_w"] = rng.normal(0, (2 / (cin * k * k)) ** 0.5, (cout, cin, k, k))
        w[f"{name}_scale"] = rng.uniform(0.5, 1.5, cout)
        w[f"{name}_bias"] = rng.uniform(-0.1, 0.1, cout)
        w[f"{name}_mean"] = rng.uniform(-0.1, 0.1, cout)
        w[f"{name}_var"] = rng.uniform(0.5, 1.5, cout)
    w["fc_w"] = rng.normal(0, 0.1, (WIDTHS[-1], classes))
    w["fc_b"] = np.zeros(classes)
    return {k: v.astype(np.float32) for k, v in w.items()}


def onnx_resnet(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The network in ONNX (NCHW) with weights `w`."""
    nodes = []
    spec = {name: (k, stride) for name, _, _, k, stride in layers()}

    def conv_bn(x: str, name: str) -> str:
        k, stride = spec[name]
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"],
                                      kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[k // 2] * 4))
        nodes.append(helper.make_node(
            "BatchNormalization", [f"{name}_c", *(f"{name}_{p}" for p in
                                                  ("scale", "bias", "mean", "var"))],
            [f"{name}_y"], epsilon=EPS))
        return f"{name}_y"

    def relu(x: str, out: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    x = relu(conv_bn("input", "stem"), "stem_out")
    for i in range(len(WIDTHS)):
        for b in "ab":
            name = f"s{i}{b}"
            y = conv_bn(relu(conv_bn(x, f"{name}_1"), f"{name}_r1"), f"{name}_2")
            short = conv_bn(x, f"{name}_sc") if f"{name}_sc" in spec else x
            nodes.append(helper.make_node("Add", [y, short], [f"{name}_sum"]))
            x = relu(f"{name}_sum", f"{name}_out")
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "resnet14", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                          ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def native_params(w: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """The same weights as native JAX holds them: HWIO kernels."""
    return {k: jnp.asarray(v.transpose(2, 3, 1, 0) if k.endswith("_w") and v.ndim == 4 else v)
            for k, v in w.items()}


def native_resnet(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The network in plain JAX, channels-last (x: NHWC)."""
    spec = {name: (k, stride) for name, _, _, k, stride in layers()}

    def conv_bn(x, name):
        k, stride = spec[name]
        y = jax.lax.conv_general_dilated(x, p[f"{name}_w"], (stride, stride),
                                         [(k // 2, k // 2)] * 2,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        inv = p[f"{name}_scale"] * jax.lax.rsqrt(p[f"{name}_var"] + EPS)
        return y * inv + (p[f"{name}_bias"] - p[f"{name}_mean"] * inv)

    x = jax.nn.relu(conv_bn(x, "stem"))
    for i in range(len(WIDTHS)):
        for b in "ab":
            name = f"s{i}{b}"
            y = conv_bn(jax.nn.relu(conv_bn(x, f"{name}_1")), f"{name}_2")
            short = conv_bn(x, f"{name}_sc") if f"{name}_sc" in spec else x
            x = jax.nn.relu(y + short)
    return jnp.mean(x, axis=(1, 2)) @ p["fc_w"] + p["fc_b"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repetitions", type=repetitions, default=15)
    parser.add_argument("--number", type=int, default=5, help="calls per timed repetition")
    args = parser.parse_args(argv)
    from d500.backends.jax import JaxBackend

    w = weights()
    model = onnx_resnet(w)
    rep = JaxBackend.prepare(model)
    x_nchw = np.random.default_rng(1).standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))
    params = native_params(w)
    native_infer = jax.jit(native_resnet)
    expected = np.asarray(native_infer(params, x_nhwc))
    if not agree(f"jax {jax.__version__}, batch {args.batch}, {len(model.graph.node)} ONNX "
                 f"nodes", rep.run([x_nchw])[0], expected):
        return 1

    graph, d500_params = rep.pure()
    d500_infer = jax.jit(lambda p, v: graph(p, {"input": v})[0])
    d500_grad = jax.jit(jax.grad(lambda p, v: jnp.sum(graph(p, {"input": v})[0]), (0, 1)))
    native_grad = jax.jit(jax.grad(lambda p, v: jnp.sum(native_resnet(p, v)), (0, 1)))
    xj_nchw, xj_nhwc = jnp.asarray(x_nchw), jnp.asarray(x_nhwc)
    ready = jax.block_until_ready
    cases = {
        "inference (jit, JAX arrays)": (lambda: ready(d500_infer(d500_params, xj_nchw)),
                                        lambda: ready(native_infer(params, xj_nhwc))),
        "forward+backward (jit, JAX arrays)": (lambda: ready(d500_grad(d500_params, xj_nchw)),
                                               lambda: ready(native_grad(params, xj_nhwc))),
        "inference (Executable.run, NumPy)": (
            lambda: rep.run([x_nchw]), lambda: np.asarray(native_infer(params, x_nhwc))),
        "forward+backward (gradients, NumPy)": (
            lambda: rep.gradients([x_nchw]),
            lambda: jax.tree_util.tree_map(np.asarray, native_grad(params, x_nhwc))),
    }
    compare(cases, args.repetitions, args.number, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
