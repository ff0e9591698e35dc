"""No cache a judge reads lies where an entry's process writes (levels 0-2: the entries' cache,
the one folder of $D500_HOME bound back writable into its namespace, d500.children._hide_home):
every `cache("NAME")` of d500's code, read in a judge's process, is hidden from an entry's. A
judge's cache named into the entries' cache (a planted pickle, a forged peak FLOP/s, a token
cache rewritten with zeros) would be read as the entry left it."""

from __future__ import annotations

import re
from pathlib import Path

import d500
from d500 import children, paths


def test_every_cache_a_judge_reads_is_hidden_from_an_entrys_process(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("D500_HOME", str(home))
    monkeypatch.delenv(paths.ENTRY_CACHE, raising=False)
    monkeypatch.setattr(paths, "_entered", [])
    names = set()
    for file in Path(d500.__file__).parent.rglob("*.py"):
        names |= set(re.findall(r"\bcache\(\s*\"([^\"]+)\"", file.read_text()))
    assert {"text", "provenance", "onnx", "models", "operators", "torch-inductor"} <= names
    for name in sorted(names):
        assert children.hidden(paths.cache(name)), name
    # the control: the entries' cache itself is not hidden (an entry's process writes there)
    assert not children.hidden(children.writable()[0])
