"""The best mode of each framework (d500.leaderboard.modes): named, computed from the boards' rows,
a loaded row never the best beside a clean one, compile time and warm caches shown."""

from __future__ import annotations

from d500 import metrics
from d500.leaderboard import modes
from d500.leaderboard.ranking import Board, Entry


def entry(backend: str, seconds: float, loaded: bool = False, compiles=(), warm=0) -> Entry:
    runs = [{"status": "succeeded", "figures": {"latency": seconds, "compile_time": c},
             "details": {"compile": {"cache": "warm" if i < warm else "cold"}}}
            for i, c in enumerate(compiles)] or [{"status": "succeeded",
                                                  "figures": {"latency": seconds}}]
    return Entry("", backend, threads=1, loaded=loaded, runs=runs,
                 aggregate={"latency": seconds})


def board(*entries: Entry, name: str = "net") -> Board:
    latency = metrics.get("latency")
    return Board(1, name, "sha", [latency], latency, "median", list(entries))


def rows(view):
    return {r[1]: r for r in view.rows}


def test_each_framework_shows_its_fastest_mode_by_name_with_every_mode_and_compile_time():
    compiled = entry("torch:compiled", 0.19, compiles=[108.5, 72.8], warm=1)
    view = modes.view([board(entry("torch", 0.25), compiled, entry("onnxruntime", 0.15),
                             entry("onnxruntime:basic", 0.2), entry("openvino", 0.16))])
    got = rows(view)
    assert got["torch"][3] == "torch:compiled" and got["torch"][4] == "190 ms"
    assert got["torch"][5] == "compile 90.7 s, 1 / 2 warm cache"
    every = got["torch"][6]
    assert every.startswith("torch:compiled 190 ms (compile") and "torch 250 ms" in every
    assert got["onnxruntime"][3] == "onnxruntime" and got["onnxruntime"][5] == "—"
    assert got["openvino"][3] == "openvino"  # one mode: still its best, shown


def test_a_loaded_row_is_never_the_best_beside_a_clean_one():
    """The attack: the compiled mode's fastest figure was timed on a loaded machine (or a
    forged load); the clean eager row is the framework's best, the loaded one listed apart."""
    fast = entry("torch:compiled", 0.01, loaded=True)
    got = rows(modes.view([board(entry("torch", 0.25), fast)]))
    assert got["torch"][3] == "torch"
    assert "torch:compiled 10 ms (loaded)" in got["torch"][6]
    every = rows(modes.view([board(entry("torch", 0.25, loaded=True),
                                   entry("torch:compiled", 0.2, loaded=True))]))
    assert every["torch"][3] == "torch:compiled ⚠ loaded"


def test_no_view_while_no_framework_ran_in_two_modes():
    assert modes.view([board(entry("torch", 0.25), entry("onnxruntime", 0.15))]) is None
