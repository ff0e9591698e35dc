"""The torch-native model-parallel baselines' rules, before any rank runs: `scheme: dtensor` and
`scheme: pipelining` each need their own dimension (>= 2 ranks of it and nothing else split), take
no compression, and are the native kind (torch backend only)."""

from __future__ import annotations

import pytest

from d500.distributed import spec
from d500.errors import ConfigError, UsageError


def test_the_baselines_parse_with_their_dimension():
    tp = spec.parse({"scheme": "dtensor", "tensor": 2}, "tp.yaml")
    assert tp.native and tp.dims(2) == {"data": 1, "pipeline": 1, "tensor": 2}
    pp = spec.parse({"scheme": "pipelining", "pipeline": 2, "micro_batches": 4,
                     "schedule": "1f1b"}, "pp.yaml")
    assert pp.native and (pp.micro_batches, pp.schedule) == (4, "1f1b")
    assert pp.logged()["pipeline"] == 2  # the board's D×P×T


@pytest.mark.parametrize("mapping, message", [
    ({"scheme": "dtensor"}, "the dtensor baseline needs 'distributed.tensor' >= 2 (one part per "
                            "rank), pipeline: 1 and shard: none (got tensor 1, pipeline 1"),
    ({"scheme": "dtensor", "tensor": 2, "pipeline": 2}, "got tensor 2, pipeline 2"),
    ({"scheme": "pipelining", "pipeline": 2, "tensor": 2}, "the pipelining baseline needs "
                                                            "'distributed.pipeline' >= 2"),
    ({"scheme": "pipelining", "pipeline": 2, "shard": "zero2"}, "shard zero2"),
])
def test_a_baseline_without_its_dimension_is_one_line(mapping, message):
    with pytest.raises(UsageError) as err:
        spec.parse(mapping, "e.yaml")
    text = str(err.value)
    assert text.startswith("e.yaml: field 'distributed.scheme': ") and message in text, text
    assert "\n" not in text


def test_a_baseline_takes_no_compression():
    with pytest.raises(ConfigError, match="the pipelining baseline runs torch's own"):
        spec.parse({"scheme": "pipelining", "pipeline": 2, "compression": "fp16"}, "e.yaml")


def test_bytes_below_what_the_cut_or_split_must_send_are_not_recorded():
    """The judge's floor (least_sent) is what d500's schemes and the baselines send on the
    digits MLP at batch 32 (test_baselines_mpi, test_tensor_mpi: 8,192 and 16,384 B); ranks that
    say they sent less a step (a baseline's count patched by its entry file, to rank better on
    bytes) get no bytes figure, the rest of the run stays."""
    from d500.builders import build
    from d500.distributed.figures import RankStats, aggregate
    from d500.distributed.pipeline.partition import least_sent as pipe
    from d500.distributed.tensor.split import least_sent as tensor
    mlp = build("mlp", (1, 8, 8), 10, loss=True)
    floor = tensor(mlp, spec.parse({"scheme": "dtensor", "tensor": 2}, "e"), 2, 32)
    assert floor == {0: 32 * 64 * 4, 1: 32 * 64 * 4}  # fc2's partial output, ring of 2
    assert tensor(mlp, spec.parse({"scheme": "sync", "tensor": 2}, "e"), 4, 32)[3] == 4096
    assert pipe(mlp, spec.parse({"scheme": "pipelining", "pipeline": 2}, "e"), 2, 32) == {
        0: 32 * 512, 1: 32 * 512}  # relu1 forward, its gradient back

    def ranks(*sent: int) -> list[RankStats]:
        return [RankStats(i, "host", 100 + i, steps=10, sent=10 * s, received=10 * s,
                          step_seconds=0.1) for i, s in enumerate(sent)]
    assert aggregate(ranks(8192, 8192), least=floor)["bytes_per_step"] == 8192
    assert aggregate(ranks(12288, 12288), least=floor)["bytes_per_step"] == 12288  # DTensor's
    forged = aggregate(ranks(8192, 0), least=floor)
    assert "bytes_per_step" not in forged and forged["step_time"] == 0.01
    assert aggregate(ranks(8192, 0))["bytes_per_step"] == 4096  # no floor: as reported


def test_a_baseline_at_more_ranks_than_its_parts_is_one_line():
    """{tensor: 2} at 4 ranks is data 2 for d500's schemes; the baselines split nothing else."""
    from d500.distributed.comm import Communicator
    from d500.distributed.ddp import whole_world
    four = Communicator.single()
    four.size = 4  # the size alone is read
    tp = spec.parse({"scheme": "dtensor", "tensor": 2}, "tp.yaml")
    with pytest.raises(UsageError, match=r"^tp.yaml: field 'distributed.tensor': the dtensor "
                                         r"baseline puts one part per rank and splits nothing "
                                         r"else \(data: 1\): tensor 2 runs at 2 ranks, not 4$"):
        whole_world(tp, four, "tensor")
