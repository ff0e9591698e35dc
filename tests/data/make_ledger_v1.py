"""Write tests/data/ledger-v1/: a small, real ledger of schema version 1, with its recorded files.

RUNNABLE ONLY WITH THE OLD CODE: d500 as of commit 64082a8, when d500/ledger.py was one module
with `SCHEMA_VERSION = 1` and no migrations. With the newer package d500/ledger/ it refuses to
run: a ledger it wrote would be of the newer schema, and the point of the file is to be what an
old `d500` wrote, so that tests/test_ledger.py can check that it is upgraded in place and still
verifies. To regenerate it:

    mkdir /tmp/d500-v1 && git archive 64082a8 | tar -x -C /tmp/d500-v1
    PYTHONPATH=/tmp/d500-v1 .venv/bin/python tests/data/make_ledger_v1.py

The folder holds ledger.sqlite and every file its runs hashed: the workload file and the
submission folder under files/, a tiny ONNX model, an artifact, and each run's MLLOG under
runs/<id>/. The ledger stores those paths as `$D500_HOME/...` (relative to the ledger's own
folder), so a copy of the whole folder anywhere verifies. Runs: 1 a level-0 run that succeeded
(workload file, submission files, evaluations, an artifact); 2 a level-1 run that failed (model
file); 3-5 the trials of a level-2 tuning study (succeeded, succeeded, diverged).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

WORKLOAD = """name: tiny-relu
level: 0
description: a tiny Relu case, recorded by tests/data/make_ledger_v1.py
operator: Relu
dtype: float32
metrics: [latency, gflops]
rank_by: latency
inputs: [[2, 3]]
attributes: {}
"""


def tiny_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def build(out: Path) -> None:
    import d500.ledger as old
    from d500.errors import Diverged

    if Path(old.__file__).name != "ledger.py" or getattr(old, "SCHEMA_VERSION", 0) != 1:
        sys.exit(f"{old.__file__}: not the schema-1 ledger module; run this script with the "
                 "old code (see its docstring)")
    if out.exists():
        shutil.rmtree(out)
    files = out / "files"
    (files / "submission").mkdir(parents=True)
    workload = files / "tiny-relu.yaml"
    workload.write_text(WORKLOAD)
    (files / "submission" / "submission.yaml").write_text(
        "name: numpy-relu\nlevel: 0\nworkloads: [tiny-relu]\noperator: op.py:Relu\n")
    (files / "submission" / "op.py").write_text(
        "import numpy as np\n\n\nclass Relu:\n    op_type = 'Relu'\n\n"
        "    def forward(self, x):\n        return np.maximum(x, 0)\n")
    model = files / "tiny-relu.onnx"
    tiny_model(model)
    ledger = old.Ledger(out / "ledger.sqlite")

    with ledger.start_run(level=0, workload="tiny-relu", submission="numpy-relu",
                          backend="numpy", seed=0, hyperparameters={"tile": 4},
                          workload_file=workload,
                          submission_files=[files / "submission"]) as run:
        run.evaluation(step=1, metrics={"latency": 2.0e-6})
        result = run.dir / "output.npy"
        result.write_bytes(b"\x93NUMPY relu output of run 1\n")
        run.artifact(result)
        run.record(figures={"latency": 1.5e-6, "gflops": 0.004}, details={"reps": 100})

    try:
        with ledger.start_run(level=1, workload="tiny-relu-net", submission="reference",
                              backend="reference", seed=1, model_file=model) as run:
            run.record(figures={"agreement": 0.0})
            raise RuntimeError("backend crashed while translating node 'relu'")
    except RuntimeError:
        pass

    with ledger.start_study("lr-sweep", level=2, workload="mnist-mlp", submission="sgd",
                            backend="torch", objective="val_accuracy",
                            search_space={"lr": [0.01, 1.0]}, budget={"trials": 3}) as study:
        for i, lr in enumerate((0.01, 0.1, 10.0)):
            try:
                with study.trial({"lr": lr, "batch_size": 32}, seed=i) as run:
                    for epoch in (1, 2):
                        run.evaluation(step=epoch * 10, epoch=epoch, wall_time=0.5 * epoch,
                                       metrics={"val_accuracy": 0.5 + lr * epoch / 10,
                                                "train_loss": 1.0 / epoch})
                    if lr > 1:
                        raise Diverged("loss is inf at step 20")
                    run.record(figures={"val_accuracy": 0.5 + lr / 5,
                                        "time_to_accuracy": 1.0 + i})
            except Diverged:
                pass
    problems = ledger.verify()
    ledger.close()
    if problems:
        sys.exit("the new ledger does not verify:\n" + "\n".join(problems))
    db = sqlite3.connect(out / "ledger.sqlite")  # fold the WAL into the file, then compact
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("VACUUM")
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "ledger-v1",
                        help="the folder to (re)create (default: tests/data/ledger-v1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:  # peak-FLOP/s cache, not the data folder
        os.environ["D500_HOME"] = tmp
        build(args.out.resolve())
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.out} ({size} bytes)")


if __name__ == "__main__":
    main()
