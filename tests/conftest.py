"""The suite's policy on machine load: a run counts as timed on a loaded machine only when other
processes took the whole machine (D500_LOADED_SHARE=1, an organiser's setting; d500's default is
a quarter). The suite's own runs share this machine with its other tests and whatever else runs
here, and its boards compare such runs; at the default share they would be ranked apart, or not,
by the neighbours' load. Tests of load itself set the share they test (monkeypatch), or fake the
load far above any share."""

from __future__ import annotations

import os

os.environ.setdefault("D500_LOADED_SHARE", "1.0")  # inherited by every d500 process a test starts
