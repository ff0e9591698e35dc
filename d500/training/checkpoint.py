"""Checkpoints of a level-2 run: what the worker hands over (the model, the optimizer's state, the
RNG states, its step count) and the file the supervisor writes from it, named by epoch.

    state = capture(trainer, steps)          # in the worker: arrays and a JSON-able header
    restore(trainer, state)                  # in a resumed run's worker: the same, put back
    digest = write(folder, epoch, state, meta)   # the supervisor: epoch-0002.npz, atomically
    state, meta = read(path, digest)         # refused when its sha256 is not the sealed one

A checkpoint is one .npz of plain arrays (read with allow_pickle=False: a file cannot run code)
and a JSON header (`meta`). The supervisor writes it (write then rename) and seals its sha256 in
the run's ledger row; it is read back only when a run is resumed (d500.training.resume).
Optimizer state: a d500 optimizer's slots and step counter (torch, TensorFlow, NumPy, JAX), or
torch.optim's state (native: true on torch); Keras' and optax's native state are not read, so
those recipes cannot checkpoint (`supported` says why). RNG states: Python's `random`, NumPy's
global generator and torch's CPU generator where torch is loaded (the sampler is a function of
the seed and the epoch, d500.training.data.samplers, so its position is the epoch alone); and
fp16's dynamic loss scale (d500.training.precision.LossScale). A level-3 checkpoint holds every
rank's state in one file: rank 0's where level 2 keeps its one process's, rank R's under
`ranks/R/`, each with its scheme's own arrays under `scheme/` (d500.distributed.resuming).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

from d500.errors import ConfigError, D500Error

FORMAT = 1  # the layout of a checkpoint file


class CheckpointError(D500Error):
    """A checkpoint that cannot be written, is missing, or does not match its run."""


def name(epoch: int) -> str:
    """The file of the checkpoint taken after `epoch` epochs."""
    return f"epoch-{epoch:04d}.npz"


def supported(backend: str, native: bool) -> None:
    """A ConfigError when a recipe's optimizer state cannot be checkpointed on `backend`."""
    from d500 import backends
    fw = backends.about(backend)
    if native and not (fw is not None and fw.native_checkpoints):
        read = ", ".join(f.name for f in backends.frameworks() if f.native_checkpoints)
        raise ConfigError(f"checkpoints: a native optimizer's state on '{backend}' is not "
                          f"read by d500 (only on {read}); train without --checkpoint-every "
                          f"or use d500's optimizer (native: false)")


# -- the worker's side -----------------------------------------------------------------------
def _numpy(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):  # torch
        return tensor.detach().cpu().numpy().copy()
    if hasattr(tensor, "numpy") and not isinstance(tensor, np.ndarray):  # TensorFlow
        tensor = tensor.numpy()
    return np.array(tensor)


def _put(holder: Any, key: Any, current: Any, value: np.ndarray) -> None:
    """Write `value` into the tensor `current` in place, or replace holder[key] with it."""
    if hasattr(current, "copy_"):  # torch
        import torch
        current.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    elif hasattr(current, "assign"):  # tf.Variable
        current.assign(value)
    elif isinstance(current, np.ndarray) and current.flags.writeable:
        current[...] = value
    else:  # an immutable array (JAX, a TensorFlow constant): the entry is replaced
        holder[key] = type(current)(value) if isinstance(current, np.ndarray) else \
            _like(current, value)


def _like(current: Any, value: np.ndarray) -> Any:
    module = type(current).__module__.split(".")[0]
    if module in ("jax", "jaxlib"):
        import jax.numpy as jnp
        return jnp.asarray(value)
    import tensorflow as tf
    return tf.constant(value)


def _optimizer(trainer: Any) -> dict[str, np.ndarray]:
    parts = getattr(trainer, "trainers", None)  # several trainers as one: each one's, by index
    if parts is not None:  # (a tensor rank's segments, d500.distributed.tensor.rank.Shards)
        return {f"{i}/{k}": v for i, t in enumerate(parts) for k, v in _optimizer(t).items()}
    if getattr(trainer, "native", False):
        opt = getattr(trainer, "torch_optimizer", None)
        if opt is None:
            raise ConfigError("checkpoints: this trainer's native optimizer state is not read")
        return {f"native/{i}/{k}": _numpy(v) for i, slots in opt.state_dict()["state"].items()
                for k, v in slots.items()}
    return optimizer_arrays(trainer.state)


def optimizer_arrays(state: Any) -> dict[str, np.ndarray]:
    """A d500 optimizer State's step counter and slots as arrays ({} for None: a ZeRO rank's
    trainer holds none, its scheme holds its block's, d500.distributed.resuming)."""
    if state is None:
        return {}
    count = state.count.n if hasattr(state.count, "n") else int(_numpy(state.count))
    out = {"count": np.asarray(count, np.int64)}
    for slot, value in state.slots.items():
        if isinstance(value, (list, tuple)):
            out.update({f"slot/{slot}/{n}": _numpy(t) for n, t in zip(state.names, value)})
        else:
            out[f"slot/{slot}"] = _numpy(value)
    return out


def _set_optimizer(trainer: Any, arrays: dict[str, np.ndarray]) -> None:
    parts = getattr(trainer, "trainers", None)
    if parts is not None:
        for i, t in enumerate(parts):
            _set_optimizer(t, {k[len(f"{i}/"):]: v for k, v in arrays.items()
                               if k.startswith(f"{i}/")})
        return
    if getattr(trainer, "native", False):
        import torch
        opt = trainer.torch_optimizer
        found: dict[int, dict[str, Any]] = {}
        for key, value in arrays.items():
            _, index, slot = key.split("/", 2)
            found.setdefault(int(index), {})[slot] = torch.from_numpy(np.array(value))
        opt.load_state_dict({"state": found, "param_groups": opt.state_dict()["param_groups"]})
        return
    set_optimizer_arrays(trainer.state, arrays)


def set_optimizer_arrays(state: Any, arrays: dict[str, np.ndarray]) -> None:
    """Put `optimizer_arrays`' output back into the State `state` (None takes none)."""
    want = set(optimizer_arrays(state))
    if set(arrays) != want:
        missing = sorted(want ^ set(arrays))
        raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer "
                              f"('{missing[0]}' is in one and not the other)")
    if state is None:
        return
    if hasattr(state.count, "n"):
        state.count.n = int(arrays["count"])
    else:
        state.count.assign(int(arrays["count"]))
    for slot, value in state.slots.items():
        if isinstance(value, list):
            for i, n in enumerate(state.names):
                _put(value, i, value[i], arrays[f"slot/{slot}/{n}"])
        else:
            _put(state.slots, slot, value, arrays[f"slot/{slot}"])


def rng_state() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Python's, NumPy's and (when loaded) torch's global RNG states: (arrays, header)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    arrays = {"python": np.asarray(words, np.uint64), "numpy": np.asarray(keys, np.uint32)}
    header = {"python": [version, gauss], "numpy": [kind, int(pos), int(has_gauss),
                                                   float(cached)]}
    if "torch" in sys.modules:
        import torch
        arrays["torch"] = torch.get_rng_state().numpy().copy()
    return arrays, header


def set_rng_state(arrays: dict[str, np.ndarray], header: dict[str, Any]) -> None:
    """Put back what `rng_state` returned."""
    version, gauss = header["python"]
    random.setstate((version, tuple(int(w) for w in arrays["python"]), gauss))
    kind, pos, has_gauss, cached = header["numpy"]
    np.random.set_state((kind, arrays["numpy"], pos, has_gauss, cached))
    if "torch" in arrays:
        import torch
        torch.set_rng_state(torch.from_numpy(np.array(arrays["torch"], np.uint8)))


def _loss_scale(trainer: Any) -> dict[str, Any] | None:
    """fp16's dynamic loss scale (d500.training.precision.LossScale) as JSON, if it has one."""
    scale = getattr(trainer, "scale", None)
    return None if scale is None else dataclasses.asdict(scale)


def capture(trainer: Any, steps: int) -> dict[str, Any]:
    """The worker's state after `steps` steps: {"model", "optimizer", "rng": {name: array}},
    "rng_header", "loss_scale" (fp16) and "steps"."""
    rng, header = rng_state()
    return {"model": {**trainer.parameters(), **trainer.buffers()},
            "optimizer": _optimizer(trainer), "rng": rng, "rng_header": header,
            "loss_scale": _loss_scale(trainer), "steps": int(steps)}


def restore(trainer: Any, state: dict[str, Any]) -> int:
    """Put a captured state back into the worker's trainer and RNGs; returns its step count."""
    model = state["model"]
    trainer.set_parameters({n: model[n] for n in trainer.parameter_names})
    if trainer.buffer_names:
        trainer.set_buffers({n: model[n] for n in trainer.buffer_names})
    _set_optimizer(trainer, state["optimizer"])
    set_rng_state(state["rng"], state["rng_header"])
    scale, saved = getattr(trainer, "scale", None), state.get("loss_scale")
    if (scale is None) != (saved is None):
        raise CheckpointError("the checkpoint's loss scale does not fit this trainer's precision")
    for key, value in (saved or {}).items():
        setattr(scale, key, [tuple(v) for v in value] if key == "history" else value)
    return int(state["steps"])


# -- the supervisor's side -------------------------------------------------------------------
PARTS = ("model", "optimizer", "rng", "scheme")  # a state's arrays ("scheme": level 3's own)


def _arrays(state: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    return {f"{prefix}{part}/{key}": np.asarray(value)
            for part in PARTS for key, value in state.get(part, {}).items()}


def _flatten(state: dict[str, Any], meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The .npz's arrays: rank 0's (or level 2's one process's) state as `part/name`, every
    other level-3 rank's as `ranks/R/part/name`, and the JSON header as `meta`."""
    arrays = _arrays(state)
    ranks = state.get("ranks") or {}
    for r, own in ranks.items():
        arrays.update(_arrays(own, f"ranks/{r}/"))
    header = {**meta, "format": FORMAT, "steps": state["steps"],
              "rng_header": state["rng_header"], "loss_scale": state.get("loss_scale")}
    if ranks:
        header["ranks"] = {str(r): {"steps": own["steps"], "rng_header": own["rng_header"]}
                           for r, own in ranks.items()}
    arrays["meta"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)
    return arrays


def write(folder: Path, epoch: int, state: dict[str, Any], meta: dict[str, Any]
          ) -> tuple[Path, str]:
    """Write the checkpoint after `epoch` epochs under `folder` (write then rename: a kill
    mid-write leaves no half file under the checkpoint's name); (its path, its sha256). A
    folder that cannot be written is a CheckpointError naming it."""
    buffer = io.BytesIO()
    np.savez(buffer, **_flatten(state, {**meta, "epoch": epoch}))
    data = buffer.getvalue()
    path = folder / name(epoch)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(data)
        temporary.replace(path)
    except OSError as err:
        raise CheckpointError(f"{folder}: cannot write a checkpoint there "
                              f"({err.strerror or err})") from err
    return path, hashlib.sha256(data).hexdigest()


def read(path: Path, sha256: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state and header of the checkpoint at `path`, after its bytes are checked against
    the sha256 sealed in the ledger (an edited, truncated or swapped file is refused by name)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({err.strerror})") from err
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise CheckpointError(f"{path}: sha256 {got} is not the {sha256} sealed in the ledger "
                              f"when it was written (the checkpoint was edited or replaced)")
    state: dict[str, Any] = {part: {} for part in PARTS}
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        meta = json.loads(bytes(npz["meta"]).decode())
        ranks = {int(r): {"steps": h["steps"], "rng_header": h["rng_header"],
                          "loss_scale": None, **{part: {} for part in PARTS}}
                 for r, h in (meta.get("ranks") or {}).items()}
        for key in npz.files:
            if key.startswith("ranks/"):
                _, r, part, rest = key.split("/", 3)
                ranks[int(r)][part][rest] = npz[key]
            elif key != "meta":
                part, rest = key.split("/", 1)
                state[part][rest] = npz[key]
    state.update(steps=meta["steps"], rng_header=meta["rng_header"],
                 loss_scale=meta.get("loss_scale"), ranks=ranks)
    return state, meta
