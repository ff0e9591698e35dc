"""The pipeline's cut of an ONNX graph (d500.distributed.pipeline.partition), its schedules and its
spec fields, in one process: stages balanced by FLOPs at cuts where few float tensors cross, the
stages' sub-models chained stage to stage computing what the whole model computes (a tensor
crossing two cuts passed through), and every impossible cut refused in one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from d500 import backends
from d500.builders import build
from d500.distributed.pipeline import schedule
from d500.distributed.pipeline.partition import PASS, partition
from d500.distributed.spec import parse
from d500.errors import ConfigError, UsageError

X = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
Y = np.arange(5, dtype=np.int64)


def chained(part, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The last stage's outputs, each stage fed the tensors the one before sent (reference
    backend: ONNX's own evaluator)."""
    reference = backends.get("reference")
    sent: list[np.ndarray] = []
    for s in part.stages:
        sub = part.model(s.index)
        onnx.checker.check_model(sub, full_check=True)
        inputs = {**dict(zip(s.receives, sent)), **{n: feeds[n] for n in s.feeds}}
        outs = reference.prepare(sub).run(inputs)
        sent = outs
    return sent


@pytest.mark.parametrize("builder", ["mlp", "lenet5"])
def test_stages_chained_compute_the_whole_model(builder):
    model = build(builder, (1, 8, 8), 10, seed=1, loss=True)
    whole = backends.get("reference").prepare(model).run({"input": X, "labels": Y})
    for stages in (2, 3):
        part = partition(model, stages)
        assert [i for s in part.stages for i in s.nodes] == list(range(len(model.graph.node)))
        assert all(s.params for s in part.stages)  # every stage has something to train
        last = chained(part, {"input": X, "labels": Y})
        for a, b in zip(last, whole):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_the_cut_balances_flops_and_is_recorded():
    part = partition(build("mlp", (1, 8, 8), 10, seed=1, loss=True), 2)
    first, second = part.stages
    # 64x128 + 128x64 + 64x10 multiply-adds: the cut after the first Gemm's Relu is closest
    assert first.sends == ["relu1"] == second.receives and first.feeds == ["input"]
    assert second.feeds == ["labels"]
    # Flatten (no formula: one per output element), Gemm (+ bias), Relu
    assert first.forward == pytest.approx(64 + 2 * 64 * 128 + 128 + 128)
    # the backward: fc1's weights' gradient only (its input is the batch), Relu's once
    assert first.cost == pytest.approx(64 + 2 * (2 * 64 * 128 + 128) + 2 * 128)
    # fc2 and fc3 compute both gradients (3 forwards each), the loss and Relu one more:
    # stage 1 costs 1.6x stage 0, and no other cut leaves fc3 a parameter of its own stage
    assert second.cost == pytest.approx(3 * (2 * 128 * 64 + 64) + 2 * 64
                                        + 3 * (2 * 64 * 10 + 10) + 2)
    assert part.imbalance == pytest.approx(second.cost / ((first.cost + second.cost) / 2))
    assert part.nbytes["relu1"] == 128 * 4
    record = part.record()
    assert record["stages"][0]["nodes"][-1] == "Relu#2 relu1"
    assert record["stages"][0]["send_bytes_per_sample"] == 512
    assert record["stages"][0]["train_flops_per_sample"] == first.cost
    assert record["stages"][0]["flops_per_sample"] == first.forward
    shown = part.show()
    assert "relu1 (512 B/sample)" in shown and "imbalance" in shown


def _chain(widths: list[int]) -> onnx.ModelProto:
    """x -> x W1 -> ... : a chain of MatMuls between the given widths (no loss)."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.random((a, b), dtype=np.float32), f"w{i}")
             for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    names = ["x", *(f"h{i}" for i in range(len(inits) - 1)), "out"]
    nodes = [helper.make_node("MatMul", [a, w.name], [b])
             for a, w, b in zip(names, inits, names[1:])]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", widths[0]])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", widths[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_cut_balances_forward_and_backward_not_the_forward_alone():
    """Forward FLOPs per sample 64 : 16 : 48. By forwards the cut after the first MatMul is
    even (64 | 64); but the first MatMul's backward computes its weights' gradient only (its
    input is the batch), the others' both gradients: 128 | 48 + 144 = 192 there, against
    128 + 48 = 176 | 144 after the second, which the cut takes."""
    part = partition(_chain([8, 4, 2, 12]), 2)
    first, second = part.stages
    assert first.nodes == [0, 1] and first.sends == ["h1"]
    assert (first.forward, first.cost) == (64 + 16, 2 * 64 + 3 * 16)
    assert (second.forward, second.cost) == (48, 3 * 48)
    assert part.imbalance == pytest.approx(176 / 160)


def _skip_model() -> onnx.ModelProto:
    """x -> h = x W1; a = relu(h); b = a W2; c = b + h; out = c W3 (one column): loss-free,
    one output: h crosses the cuts after a and after b, so a middle stage passes it through
    (forward and backward FLOPs per sample 64, 8 | 96 | 8, 24)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.random(shape, dtype=np.float32), n)
             for n, shape in (("w1", (4, 4)), ("w2", (4, 4)), ("w3", (4, 1)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["b"]),
             helper.make_node("Add", ["b", "h"], ["c"]),
             helper.make_node("MatMul", ["c", "w3"], ["out"])]
    graph = helper.make_graph(
        nodes, "skip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_tensor_crossing_two_cuts_passes_through_the_stage_between():
    model = _skip_model()
    part = partition(model, 3)
    middle = part.stages[1]
    assert "h" in middle.receives and "h" in middle.sends
    assert any(n.op_type == "Identity" and n.output[0] == "h" + PASS
               for n in part.model(1).graph.node)
    x = np.random.default_rng(3).random((3, 4), dtype=np.float32)
    (out,) = chained(part, {"x": x})
    (whole,) = backends.get("reference").prepare(model).run({"x": x})
    np.testing.assert_allclose(out, whole, rtol=1e-6)


def test_impossible_cuts_are_one_line_each():
    mlp = build("mlp", (1, 8, 8), 10, seed=1, loss=True)
    with pytest.raises(UsageError, match="8 pipeline stages for a graph of 7 nodes"):
        partition(mlp, 8, where="e.yaml")
    with pytest.raises(UsageError, match="leaves a parameter in every stage"):
        partition(mlp, 4)  # the loss node alone would be a stage with nothing to train
    shared = _skip_model()
    shared.graph.node[2].input[1] = "w1"  # w1 read by the first and the third MatMul
    part = partition(shared, 3)  # tied: held by both stages, its gradient summed (scheme)
    assert part.shared == {"w1": [0, 1]}
    assert "w1" in {t.name for t in part.model(1).graph.initializer}


def test_schedules_run_every_pass_once_in_order():
    for name in schedule.SCHEDULES:
        for stage in range(4):
            ops = schedule.ops(name, stage, 4, 6)
            assert sorted(ops) == sorted([(k, i) for k in "FB" for i in range(6)])
            assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(6))
    assert schedule.ops("1f1b", 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                             ("F", 3), ("B", 2), ("B", 3)]
    assert schedule.stashed("gpipe", 0, 4, 8) == 8 and schedule.stashed("1f1b", 0, 4, 8) == 4
    assert schedule.bubble(4, 12) == pytest.approx(3 / 15)



def test_the_simulated_bubble_is_the_theory_for_equal_stages_and_more_for_unequal():
    """schedule.simulate (free messages) leaves (P-1)/(M+P-1) on every stage of equal stages,
    whatever a pass costs; the MLP's only cut at 2 stages (stage 0: a forward and the weights'
    gradient, 2 units; stage 1: a forward and both gradients, 3) leaves 0.23 at M = 8, not 0.11.
    A stage padded with useless work to match the other shows the theory's bubble, and its step
    is no shorter: the padding lengthens the step (the benchmark prints the step beside it)."""
    for name in schedule.SCHEDULES:
        for stages in (2, 3, 4):
            for m in (1, 2, 4, 8):
                idle = schedule.simulate(name, [1.0] * stages, [2.0] * stages, m)
                assert idle == pytest.approx([schedule.bubble(stages, m)] * stages)
        unequal = schedule.simulate(name, [1.0, 1.0], [1.0, 2.0], 8)
        assert np.mean(unequal) == pytest.approx(1 - 8 * 5 / (2 * 26))  # a step of 2 + 3 + 7 x 3
        assert unequal[0] > unequal[1] > 0  # the cheaper stage waits
        padded = schedule.simulate(name, [2.0, 1.0], [1.0, 2.0], 8)
        assert np.mean(padded) == pytest.approx(schedule.bubble(2, 8))
        assert 8 * 3 / (1 - padded[0]) > 8 * 2 / (1 - unequal[0])  # its step: 27 against 26


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_a_stage_keeps_its_forward_for_its_backward(backend):
    """StageModel.forward keeps what its backward needs (Executable.kept): the torch backend its
    autograd graph (no second forward; the bytes it saved: stage 0's input and ReLU output),
    the reference backend the inputs (re-run); the gradients are gradients(grad_outputs=...)'s
    exactly."""
    from d500.distributed.pipeline.stage import StageModel
    from d500.training.optimizers.registry import make
    part = partition(build("mlp", (1, 8, 8), 10, seed=0, loss=True), 2)
    first, last = (StageModel(part, s, backends.get(backend), make("sgd", lr=0.1))
                   for s in (0, 1))
    feeds = first.inputs([], {"input": X, "labels": Y})
    sent, kept, held = first.forward(feeds)
    _, _, back = last.loss(last.inputs(sent, {"input": X, "labels": Y}), 1.0)
    grads, _ = first.backward(kept, back)
    _, want = first.exe.gradients(feeds, grad_outputs=dict(zip(first.sent_names, back)),
                                  wrt=first.wrt)
    for name in first.params:
        np.testing.assert_array_equal(grads[name], want[name])
    assert held == 5 * (256 + 512 if backend == "torch" else 256)  # bytes a sample: 64 + 128


def test_the_spec_takes_a_pipeline_with_sync_only():
    spec = parse({"scheme": "sync", "pipeline": 2, "micro_batches": 4, "schedule": "1f1b"},
                 "e.yaml")
    assert spec.dims(2) == {"data": 1, "pipeline": 2, "tensor": 1}
    with pytest.raises(UsageError) as err:  # data not given: no '?' for it, the multiple to use
        spec.dims(1)
    assert str(err.value) == (
        "e.yaml: fields 'distributed.pipeline' x 'tensor' = 2 x 1 = 2 ranks do not divide the "
        "world size 1 (mpiexec -n 1): run at a multiple of 2 ('distributed.data', not given, is "
        "the world size / 2)")
    with pytest.raises(UsageError, match=r"= 2 x 2 x 1 must equal the world size 2 \(mpiexec "
                                         r"-n 2\): the entry runs at mpiexec -n 4$"):
        parse({"scheme": "sync", "data": 2, "pipeline": 2}, "e.yaml").dims(2)
    assert spec.logged()["micro_batches"] == 4 and spec.logged()["pipeline_schedule"] == "1f1b"
    with pytest.raises(UsageError, match="scheme: sync, uncompressed, shard: none"):
        parse({"scheme": "ps", "pipeline": 2}, "e.yaml")
    with pytest.raises(UsageError, match="shard: none"):
        parse({"scheme": "sync", "pipeline": 2, "shard": "zero1"}, "e.yaml")
    with pytest.raises(ConfigError, match="'distributed.schedule' must be one of gpipe, 1f1b"):
        parse({"scheme": "sync", "pipeline": 2, "schedule": "zigzag"}, "e.yaml")
    with pytest.raises(ConfigError, match="'distributed.micro_batches' must be a whole number"):
        parse({"scheme": "sync", "pipeline": 2, "micro_batches": 0}, "e.yaml")
    assert parse({"scheme": "sync", "tensor": 2, "pipeline": 2}, "e.yaml").dims(4) == {
        "data": 1, "pipeline": 2, "tensor": 2}  # composed: d500.distributed.pipeline.split_stage
    with pytest.raises(UsageError, match="tensor parallelism composes with the data dimension"):
        parse({"scheme": "ps", "tensor": 2}, "e.yaml")


def test_the_judge_believes_no_bubble_below_what_any_stages_leave():
    """Stages of any costs wait, on average, more than BUBBLE_FLOOR x (P-1)/(M+P-1) of a step
    with free messages (schedule.simulate over random costs: unequal stages can wait less than
    the theory, never near the floor); so the judge (figures.aggregate, given its own theory)
    records no bubble_fraction whose mean over the ranks is below the floor: a rank reporting
    that it never waited, or a theory of its own, is not believed."""
    from d500.distributed.figures import BUBBLE_FLOOR, RankStats, aggregate
    rng = np.random.default_rng(0)
    for _ in range(200):
        stages, m = int(rng.integers(2, 5)), int(rng.integers(1, 9))
        f, b = (np.exp(rng.uniform(-4, 3, stages)).tolist() for _ in "fb")
        for name in schedule.SCHEDULES:
            least = BUBBLE_FLOOR * schedule.bubble(stages, m)
            assert np.mean(schedule.simulate(name, f, b, m)) > 1.25 * least

    def ranks(*waits: float, theory: float = 0.2) -> list[RankStats]:
        return [RankStats(i, "h", i, steps=10, step_seconds=1.0,
                          scheme={"bubble_measured": w, "bubble_theory": theory})
                for i, w in enumerate(waits)]
    honest = aggregate(ranks(0.26, 0.18), bubble=schedule.bubble(2, 4))
    assert honest["bubble_fraction"] == pytest.approx(0.22) and honest["bubble_theory"] == 0.2
    assert "bubble_fraction" not in aggregate(ranks(0.0, 0.02), bubble=0.2)  # never waited
    forged = aggregate(ranks(0.01, 0.01, theory=0.01), bubble=0.2)  # its own theory, lower
    assert "bubble_fraction" not in forged and forged["bubble_theory"] == 0.2
    assert BUBBLE_FLOOR * 0.2 <= 0.96 * 0.2  # honest runs' lowest (M = 1) stays recorded


@pytest.mark.mpi
def test_more_micro_batches_than_a_steps_samples_is_one_line_on_every_rank(tmp_path):
    """micro_batches: 100 at digits-mlp's global batch of 32 trained 32 one-sample micro-batches
    and recorded micro_batches 100 (and the bubble theory of 100); now every rank refuses it
    in its first checks, before any framework loads."""
    from tests.distributed import level3_jobs as jobs
    if jobs.MPIEXEC is None:
        pytest.skip("no mpiexec beside Python")
    entry = jobs.entry(tmp_path, "pipeline-1f1b", distributed={
        "scheme": "sync", "pipeline": 2, "micro_batches": 100, "schedule": "1f1b"})
    result = jobs.train(tmp_path / "home", 2, jobs.LEVEL3 / "digits-mlp.yaml", entry,
                        "--seed", "0", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(
        "field 'distributed.micro_batches' is 100, more than the 32 samples each pipeline gets a "
        "step (global batch 32 over 1 data group(s)): at most 32" in line for line in lines), lines
