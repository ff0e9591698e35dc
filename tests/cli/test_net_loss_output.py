"""A level-1 workload whose `model.loss` names no output of its model says which outputs it has,
and the closest (it said only 'not an output of the model'), before a framework loads (the
thread counts imported torch first: 4-6 s)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx

from d500.builders import build


def test_a_mistyped_loss_output_names_the_models_outputs(tmp_path):
    onnx.save(build("mlp", "digits", loss=True), tmp_path / "my-net.onnx")
    (tmp_path / "my-net.yaml").write_text(
        "name: my-net\nlevel: 1\nmodel: {file: my-net.onnx, loss: los}\nbatch_size: 8\n"
        "train: true\nmetrics: [latency, train_step_time]\nrank_by: latency\n")
    code = ("import sys; from d500.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, "net", "bench", "my-net.yaml",
                           "--backends", "torch", "--budget", "0.1"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, check=False,
                          env={**os.environ, "D500_HOME": str(tmp_path / "home")})
    assert done.stdout.strip() == "2 False", (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert "(its outputs: logits, loss; did you mean 'loss'?)" in done.stderr, done.stderr
