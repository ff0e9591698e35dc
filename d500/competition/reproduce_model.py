"""Finding a level-1 run's model for `d500 reproduce`: a run records its model file's path and
sha256, and a package holds no model file of its own, so the model is looked for by that sha256
alone (a path or a name in an untrusted package is only a hint): among the packed submission
files, at the recorded path on this machine, among the onnx package's light models and their
seeded random-weight variants (`d500 net check --random-weights` caches them by name), and as the
rulebook's level-1 workload of the run builds it (a net bench run's own workload, or the one a
`d500 run` check `check:<workload>` was of).

    path, how = resolve_model(pkg, run, rules_dir, folder, workload=None)   # or Unreproducible
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from d500.competition.reproduce_prepare import Unreproducible
from d500.errors import D500Error

RANDOM_VARIANT = re.compile(r"^(?P<stem>.+)-random(?P<seed>\d+)-[0-9a-f]{16}\.onnx$")
Found = Iterator[tuple[Path, str]]  # candidate files and where each comes from


def resolve_model(pkg: Any, run: Any, rules_dir: Path, folder: Path, workload: Any = None
                  ) -> tuple[Path, str]:
    """The model file the run recorded, found here by its sha256 (see the module docstring),
    and where it was found; Unreproducible when it is nowhere."""
    from d500.competition.layout import sha256
    from d500.ledger.integrity import sha256_file
    want, stored = run.row.get("model_sha256"), run.row.get("model_file") or ""
    if not want:
        raise Unreproducible("it recorded no model file")
    for rel, data in sorted(pkg.submission_files().items()):
        if sha256(data) == want:
            return folder / rel, f"packed (submission file {rel})"
    for make in (_recorded_path, _light_model, _random_variant, _rulebook_model):
        try:
            for path, how in make(stored, rules_dir, workload, run):
                if path.is_file() and sha256_file(path) == want:
                    return path, how
        except (D500Error, OSError):
            continue  # that source cannot give it (unreadable, not buildable): the next
    raise Unreproducible(f"its model {PurePosixPath(stored).name or '?'} (sha256 {want[:12]}…) "
                         "is neither packed (no submission file has that sha256) nor found here "
                         "(the recorded path, the onnx package's light models and their random "
                         "weights, the rulebook's level-1 workloads)")


def _recorded_path(stored: str, rules_dir: Path, workload: Any, run: Any) -> Found:
    """The path the run recorded, on this machine (under $D500_HOME when it was recorded so)."""
    from d500.ledger.store import HOME_PREFIX
    from d500.paths import PROJECT_ROOT, home
    if stored.startswith(HOME_PREFIX):
        yield home() / stored[len(HOME_PREFIX):], f"the recorded path, under {home()}"
    elif stored:
        path = Path(stored)
        yield (path if path.is_absolute() else PROJECT_ROOT / path), "the recorded path"


def _light_model(stored: str, rules_dir: Path, workload: Any, run: Any) -> Found:
    """Every light model shipped inside the installed onnx package, as it is."""
    from d500.networks.workloads import light_folder
    for path in sorted(light_folder().glob("*.onnx")):
        yield path, f"the onnx package's light model {path.name}"


def _random_variant(stored: str, rules_dir: Path, workload: Any, run: Any) -> Found:
    """`net check --random-weights` of a light model: its cached file, made again."""
    match = RANDOM_VARIANT.match(PurePosixPath(stored).name)
    if match is None:
        return
    from d500.model import load
    from d500.networks.weights import randomize
    from d500.networks.workloads import cached_model, light_folder
    stem, seed = match["stem"], int(match["seed"])
    light = light_folder() / f"{stem}.onnx"
    if light.is_file():
        proto, _ = randomize(load(light), seed)
        yield (cached_model(proto, f"{stem}-random{seed}"),
               f"the onnx package's {light.name} with random weights (seed {seed})")


def _rulebook_model(stored: str, rules_dir: Path, workload: Any, run: Any) -> Found:
    """The model a rulebook level-1 workload builds: the bench run's own workload, or the one a
    `d500 run` check (`check:<workload name>`) was of."""
    from d500 import levels
    from d500.networks import workloads
    found = [workload] if workload is not None else []
    name = (run.workload or "").removeprefix("check:")
    if not found:
        for path in sorted((rules_dir / levels.get(1).folder).glob("*.yaml")):
            loaded = workloads.load(path)
            if loaded.name == name:
                found.append(loaded)
    for wl in found:
        for loss in dict.fromkeys([wl.train, False, True]):
            if loss and not wl.loss_output:
                continue
            _, path = wl.onnx_model(loss=loss)
            yield path, f"built by the rulebook's workload {wl.name}" + (
                " (with its loss)" if loss else "")
