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
