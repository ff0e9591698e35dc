"""`d500 reproduce` says of every level-3 scheme whose result depends on the ranks' timing that
even a re-run on the origin's machine differs (an honest ssp run re-ran here in 7 epochs where
it had taken 12, with no word why): the schemes that refuse checkpoints for that reason."""

from __future__ import annotations

from d500.competition.reproduce import TIMING_DEPENDENT
from d500.distributed.schemes import SCHEMES


def test_every_scheme_that_depends_on_timing_is_named_so():
    timing = {name for name, cls in SCHEMES.items() if "timing" in cls.unresumable}
    assert timing == {"async_ps", "ssp"}
    assert timing <= set(TIMING_DEPENDENT)
