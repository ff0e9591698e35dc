"""A submission's own optimizer file, kept out of the judge's process: its hyperparameters are
validated in a short-lived child process (`python -m d500.training.entry`), and the class is
imported only where the entry trains (the worker, d500.training.worker; a level-3 rank).

    entry = EntryOptimizer(Path("submissions/lion/lion.py"), "Lion")
    entry.probe([{"lr": 1e-4}, {"lr": 1e-3, "beta1": 0.9}])  # one child process for both
    entry.name                      # the class's `name`
    entry.hp({"lr": 1e-4})          # the validated hyperparameters, defaults filled in
    cls = entry.load()              # imports the file: only in a process that may run it

Importing the file runs its top-level code; code that patches `time.perf_counter` or walks the
stack must find neither the judge's clock nor the held-out data, so the judge never imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d500.errors import ConfigError

PROBE_TIMEOUT = 120.0  # seconds for the child to import the file and validate every point


def _key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


@dataclass(eq=False)
class EntryOptimizer:
    """An Optimizer subclass `class_name` in the file `file`, known to the judge only through
    what a child process reported of it."""

    file: Path
    class_name: str
    name: str = ""
    _checked: dict[str, dict[str, Any] | str] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"file": self.file, "class_name": self.class_name, "name": self.name,
                "_checked": dict(self._checked)}

    def probe(self, points: list[dict[str, Any]]) -> None:
        """Validate hyperparameter points in a child process (one for all of them; points seen
        before are not sent again); a file that does not load is a ConfigError naming it, a bad
        point's error is `hp`'s."""
        todo = list({_key(p): p for p in points if _key(p) not in self._checked}.values())
        if not todo and self.name:
            return
        request = json.dumps({"file": str(self.file), "class": self.class_name,
                              "points": todo}, default=str)
        from d500 import children
        from d500.distributed.launch import launched_by_mpi
        if not launched_by_mpi():  # the file's code runs next: the judge's memory closed to it
            children.shield()  # (a /proc/PID/mem opened before stays readable), not a rank's
        here = str(Path(__file__).resolve().parents[2])  # this d500, wherever it was imported
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [here, *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            done = subprocess.run([sys.executable, "-m", "d500.training.entry"], input=request,
                                  capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                                  env=env)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{self.file}: importing it and checking its hyperparameters took "
                              f"over {PROBE_TIMEOUT:g} s") from None
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"{self.file}: checking the optimizer in a child process failed "
                              f"(exit {done.returncode}): {tail}") from None
        if "error" in answer:
            raise ConfigError(answer["error"])
        self.name = answer["name"]
        for point, result in zip(todo, answer["results"]):
            self._checked[_key(point)] = result

    def hp(self, point: dict[str, Any]) -> dict[str, Any]:
        """The validated hyperparameters of `point` (defaults filled in), probing it if new."""
        found = self._checked.get(_key(point))
        if found is None:
            self.probe([point])
            found = self._checked[_key(point)]
        if isinstance(found, str):
            raise ConfigError(found)
        return dict(found)

    def load(self) -> type:
        """The class itself, imported in this process (never in the judge's)."""
        from d500.training.optimizers import load_optimizer
        return load_optimizer(self.file, self.class_name)


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """The probe's reply: the class's name and, per point, its hyperparameters or the error."""
    try:
        from d500.training.optimizers import load_optimizer
        cls = load_optimizer(Path(request["file"]), request["class"])
    except ConfigError as err:
        return {"error": str(err)}
    results: list[Any] = []
    for point in request["points"]:
        try:
            results.append(cls(**point).hp)
        except ConfigError as err:
            results.append(str(err))
        except TypeError as err:
            results.append(f"{request['file']}: {request['class']}: {err}")
        except Exception as err:  # noqa: BLE001 - the entry's own check() failed: say where
            results.append(f"{request['file']}: {request['class']}({point}) failed: "
                           f"{type(err).__name__}: {err}")
    name = cls.name if cls.name != "?" else request["class"]
    return {"name": name, "results": results}


if __name__ == "__main__":
    from d500 import children
    children.bound_to_parent()
    asked = json.loads(sys.stdin.read())  # (first: the file's folder stays seen by the split)
    children.keep(shown=[os.path.dirname(os.path.abspath(asked["file"]))])  # nothing the
    #                      file's code starts outlives the probe, nor reads the results folder
    children.confine()  # (not shielding its parent: a level-3 rank must stay readable by its
    #                      peers, whose MPI reads large messages from its memory)
    reply = _answer(asked)
    sys.stdout.write("\n" + json.dumps(reply, default=float) + "\n")
