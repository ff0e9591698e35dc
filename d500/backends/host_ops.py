"""String ops, the classic ai.onnx.ml ops, box selection, Unique and image decoding, which walk
values in Python: NumPy, shared.

Strings stay NumPy object arrays (no array framework holds them); a numeric input is brought to
the host and a numeric result sent back through a backend's `Io`, so torch and JAX run the same
code. `table(io)` is the op table a backend merges into its own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Io:
    """How a backend moves values: `host(x)` to NumPy, `device(node, array, like)` back (in the
    dtype of `like` when given)."""

    host: Callable[[Any], np.ndarray]
    device: Callable[..., Any]


def _strings(x) -> np.ndarray:
    return np.asarray(x, dtype=object)


def _values(io: Io, x) -> np.ndarray:
    return _strings(x) if isinstance(x, np.ndarray) else io.host(x)


def StringConcat(io, node, a, b):
    return np.asarray(np.frompyfunc(lambda u, v: u + v, 2, 1)(_strings(a), _strings(b)),
                      dtype=object)


def RegexFullMatch(io, node, x):
    pattern = re.compile(node.attr("pattern"))
    hits = np.frompyfunc(lambda s: pattern.fullmatch(s) is not None, 1, 1)(_strings(x))
    return io.device(node, np.asarray(hits, dtype=bool))


def StringSplit(io, node, x):
    delimiter = node.attr("delimiter") or None
    maxsplit = node.attr("maxsplit", -1)
    flat = [s.split(delimiter, maxsplit) if delimiter else s.split(None, maxsplit)
            for s in _strings(x).reshape(-1)]
    width = max((len(p) for p in flat), default=0)
    out = np.full((len(flat), width), "", dtype=object)
    for i, parts in enumerate(flat):
        out[i, :len(parts)] = parts
    counts = np.array([len(p) for p in flat], dtype=np.int64).reshape(np.shape(x))
    return out.reshape(*np.shape(x), width), io.device(node, counts)


def StringNormalizer(io, node, x):
    stops = set(node.attr("stopwords") or [])
    sensitive = node.attr("is_case_sensitive", 0)
    action = node.attr("case_change_action", "NONE")
    words = list(_strings(x).reshape(-1))
    if stops:
        if sensitive:
            words = [w for w in words if w not in stops]
        else:
            low = {s.lower() for s in stops}
            words = [w for w in words if w.lower() not in low]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    words = words or [""]
    out = np.array(words, dtype=object)
    return out.reshape(1, -1) if np.ndim(x) == 2 else out


# -- ai.onnx.ml ----------------------------------------------------------------------------------
_KEY_VALUE_KINDS = ("strings", "int64s", "floats")


def _attr_list(node, prefix: str):
    for kind in _KEY_VALUE_KINDS:
        value = node.attr(f"{prefix}_{kind}")
        if value is not None:
            return list(value), kind
    tensor = node.attr(f"{prefix}_tensor")
    if tensor is not None:
        return tensor.reshape(-1).tolist(), "tensor"
    return None, None


def LabelEncoder(io, node, x):
    keys, _ = _attr_list(node, "keys")
    values, kind = _attr_list(node, "values")
    default_tensor = node.attr("default_tensor")
    if default_tensor is not None:
        default = default_tensor.reshape(-1)[0]
    elif kind == "strings":
        default = node.attr("default_string", "_Unused")
    elif kind == "int64s":
        default = node.attr("default_int64", -1)
    else:
        default = node.attr("default_float", -0.0)
    table = dict(zip(keys, values))
    source = _values(io, x)
    mapped = [table.get(k.item() if hasattr(k, "item") else k, default)
              for k in source.reshape(-1)]
    if kind == "strings" or (kind == "tensor" and node.attr("values_tensor").dtype.kind in "OUS"):
        return np.array(mapped, dtype=object).reshape(source.shape)
    dtype = node.attr("values_tensor").dtype if kind == "tensor" else (
        np.int64 if kind == "int64s" else np.float32)
    return io.device(node, np.array(mapped, dtype=dtype).reshape(source.shape))


def TfIdfVectorizer(io, node, x):
    """n-gram counts (with skips) of integer or string sequences, weighted as TF, IDF or TFIDF."""
    counts = list(node.attr("ngram_counts"))
    indexes = list(node.attr("ngram_indexes"))
    pool = node.attr("pool_int64s")
    pool = list(pool) if pool is not None else list(node.attr("pool_strings"))
    low, high = node.attr("min_gram_length"), node.attr("max_gram_length")
    max_skip, mode = node.attr("max_skip_count"), node.attr("mode")
    weights = node.attr("weights")
    grams: dict[tuple, int] = {}
    k = 0
    for n, start in enumerate(counts, start=1):
        end = counts[n] if n < len(counts) else len(pool)
        for i in range(start, end, n):
            grams[tuple(pool[i:i + n])] = indexes[k]
            k += 1
    rows = _values(io, x)
    batched = rows.ndim == 2
    rows = rows if batched else rows[None]
    width = max(indexes) + 1
    out = np.zeros((rows.shape[0], width), dtype=np.float32)
    for r, row in enumerate(rows.tolist()):
        for n in range(low, high + 1):
            for skip in range(max_skip + 1 if n > 1 else 1):
                step = skip + 1
                for s in range(len(row) - (n - 1) * step):
                    hit = grams.get(tuple(row[s + j * step] for j in range(n)))
                    if hit is not None:
                        out[r, hit] += 1
    if mode == "IDF":
        out = (out > 0).astype(np.float32)
    if mode in ("IDF", "TFIDF") and weights is not None:
        out = out * np.asarray(weights, dtype=np.float32)
    return io.device(node, out if batched else out[0])


_TESTS = {0: np.less_equal, 1: np.less, 2: np.greater_equal, 3: np.greater, 4: np.equal,
          5: np.not_equal}


def TreeEnsemble(io, node, x):
    """Tree ensembles (ai.onnx.ml 5): walk every tree per row, aggregate the leaf weights."""
    modes = np.asarray(node.attr("nodes_modes")).reshape(-1)
    splits = np.asarray(node.attr("nodes_splits"), dtype=np.float64).reshape(-1)
    features = node.attr("nodes_featureids")
    true_ids, true_leaf = node.attr("nodes_truenodeids"), node.attr("nodes_trueleafs")
    false_ids, false_leaf = node.attr("nodes_falsenodeids"), node.attr("nodes_falseleafs")
    missing_true = node.attr("nodes_missing_value_tracks_true") or [0] * len(modes)
    targets, weights = node.attr("leaf_targetids"), np.asarray(
        node.attr("leaf_weights"), dtype=np.float64).reshape(-1)
    members: dict[int, set[float]] = {}
    values = list(np.asarray(node.attr("membership_values", np.zeros(0))).reshape(-1))
    for i in np.flatnonzero(modes == 6):
        cut = next((k for k, v in enumerate(values) if np.isnan(v)), len(values))
        members[int(i)], values = set(values[:cut]), values[cut + 1:]
    aggregate = node.attr("aggregate_function", 1)
    roots = node.attr("tree_roots")
    rows = io.host(x).astype(np.float64)
    out = np.zeros((rows.shape[0], node.attr("n_targets")))
    for r, row in enumerate(rows):
        per_target: dict[int, list[float]] = {}
        for root in roots:
            i, leaf = root, False
            while not leaf:
                value = row[features[i]]
                if np.isnan(value):
                    go = bool(missing_true[i])
                elif modes[i] == 6:
                    go = value in members[i]
                else:
                    go = bool(_TESTS[int(modes[i])](value, splits[i]))
                i, leaf = (true_ids[i], true_leaf[i]) if go else (false_ids[i], false_leaf[i])
            per_target.setdefault(targets[i], []).append(weights[i])
        for t, ws in per_target.items():
            out[r, t] = {0: lambda v: sum(v) / len(roots), 1: sum, 2: min, 3: max}[aggregate](ws)
    transform = node.attr("post_transform", 0)
    if transform == 1:
        out = np.exp(out - out.max(1, keepdims=True))
        out /= out.sum(1, keepdims=True)
    elif transform == 2:
        out = 1 / (1 + np.exp(-out))
    elif transform not in (0, None):
        raise node.unsupported(f"post_transform {transform}")
    return io.device(node, out, like=x)


# -- detection -----------------------------------------------------------------------------------
def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max), whatever corner order or format they come in."""
    if center:
        x, y, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], -1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2),
                     np.maximum(x1, x2)], -1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    top = np.maximum(box[0], others[:, 0])
    left = np.maximum(box[1], others[:, 1])
    bottom = np.minimum(box[2], others[:, 2])
    right = np.minimum(box[3], others[:, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where((inter > 0) & (union > 0), inter / np.where(union > 0, union, 1), 0.0)


def _scalar(io: Io, x, cast, default):
    return cast(io.host(x).reshape(-1)[0]) if x is not None and np.size(x) else default


def NonMaxSuppression(io, node, boxes, scores, max_out=None, iou_threshold=None,
                      score_threshold=None):
    """Greedy selection per batch and class, by descending score: [batch, class, box] rows."""
    limit = _scalar(io, max_out, int, 0)
    iou_limit = _scalar(io, iou_threshold, float, 0.0)
    floor = _scalar(io, score_threshold, float, None)
    scores = io.host(scores)
    corners = _corners(io.host(boxes).astype(np.float64), bool(node.attr("center_point_box", 0)))
    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = np.argsort(-s.astype(np.float64), kind="stable").tolist()
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if floor is not None and not float(s[i]) > floor:
                    break
                if kept and bool((_iou(corners[b, i], corners[b, kept]) > iou_limit).any()):
                    continue
                kept.append(i)
            selected += [[b, c, i] for i in kept]
    return io.device(node, np.array(selected, dtype=np.int64).reshape(-1, 3))


def unique(array: np.ndarray, axis: int | None, sort: bool) -> tuple[np.ndarray, ...]:
    """ONNX Unique: (values, first indices, inverse indices, counts), the values in the array's
    dtype and in order of first occurrence unless `sort`, the indices 1-D int64."""
    values, first, inverse, counts = np.unique(array, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sort:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (values.astype(array.dtype),
            *(np.asarray(v, np.int64).reshape(-1) for v in (first, inverse, counts)))


def decode_image(data: bytes, pixel_format: str) -> np.ndarray:
    """An encoded image (JPEG, PNG, BMP, ...) as ImageDecoder's HWC uint8 pixels: RGB, BGR or
    Grayscale (Pillow's decoders)."""
    import io

    import PIL.Image
    image = PIL.Image.open(io.BytesIO(data))
    if pixel_format == "Grayscale":
        return np.expand_dims(np.array(image.convert("L")), 2)
    pixels = np.array(image.convert("RGB"))
    return np.ascontiguousarray(pixels[:, :, ::-1] if pixel_format == "BGR" else pixels)


def roi_samples(roi, scale, pooled, shape, ratio, half_pixel):
    """(flat positions, weights, samples per bin) of one region's bilinear samples, as ONNX
    RoiAlign defines them: positions and weights are [out_h, out_w, grid_h, grid_w, 4 corners]
    into an image flattened to height * width."""
    height, width = shape
    ph_n, pw_n = pooled
    off = 0.5 if half_pixel else 0.0
    sw, sh, ew, eh = (np.asarray(roi, np.float64) * scale - off).tolist()
    rw, rh = ew - sw, eh - sh
    if not half_pixel:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    bh, bw = rh / ph_n, rw / pw_n
    gh = int(ratio) if ratio > 0 else int(np.ceil(rh / ph_n))
    gw = int(ratio) if ratio > 0 else int(np.ceil(rw / pw_n))
    ph, pw, iy, ix = np.meshgrid(np.arange(ph_n), np.arange(pw_n), np.arange(gh),
                                 np.arange(gw), indexing="ij")
    y = sh + ph * bh + (iy + 0.5) * bh / max(gh, 1)
    x = sw + pw * bw + (ix + 0.5) * bw / max(gw, 1)
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = np.maximum(y, 0), np.maximum(x, 0)
    y_low, x_low = y.astype(np.int64), x.astype(np.int64)
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = np.where(y_edge, height - 1, y_low), np.where(x_edge, width - 1, x_low)
    y, x = np.where(y_edge, y_low, y), np.where(x_edge, x_low, x)
    y_high, x_high = np.where(y_edge, y_low, y_low + 1), np.where(x_edge, x_low, x_low + 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    weights = np.stack([hy * hx, hy * lx, ly * hx, ly * lx], -1)
    weights[outside] = 0
    pos = np.stack([y_low * width + x_low, y_low * width + x_high,
                    y_high * width + x_low, y_high * width + x_high], -1)
    pos[outside] = 0
    return pos, weights, gh * gw


def roi_align(node, hw: tuple[int, int]) -> tuple[tuple[int, int], Callable]:
    """A RoiAlign node's (output height, width) and its sampler over an (h, w) image: one
    region's box -> roi_samples by the node's scale, sampling ratio and coordinate mode."""
    pooled = (node.attr("output_height", 1), node.attr("output_width", 1))
    scale, ratio = node.attr("spatial_scale", 1.0), node.attr("sampling_ratio", 0)
    half = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    return pooled, lambda roi: roi_samples(roi, scale, pooled, hw, ratio, half)


def table(io: Io) -> dict[str, Any]:
    """These ops bound to a backend's `io`, keyed as a backend's op table keys them."""
    ops = {"": (StringConcat, RegexFullMatch, StringSplit, StringNormalizer, TfIdfVectorizer,
                NonMaxSuppression),
           "ai.onnx.ml::": (LabelEncoder, TreeEnsemble)}
    return {prefix + fn.__name__: functools.partial(fn, io)
            for prefix, fns in ops.items() for fn in fns}
