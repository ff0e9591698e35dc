"""ONNX-ML operators (ai.onnx.ml) in TensorFlow."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d500.backends.graph import registry

OPS, op = registry("ai.onnx.ml")


@op
def Binarizer(node, x):
    return tf.where(x > node.attr("threshold", 0.0), tf.ones_like(x), tf.zeros_like(x))


@op
def ArrayFeatureExtractor(node, x, indices):
    return tf.gather(x, tf.reshape(indices, [-1]), axis=x.shape.rank - 1)


@op
def LabelEncoder(node, x):
    """A lookup table from keys_* to values_* (or the tensor forms), with a default."""
    keys = next(node.attr(k) for k in ("keys_tensor", "keys_strings", "keys_int64s",
                                       "keys_floats") if node.attr(k) is not None)
    values = next(node.attr(k) for k in ("values_tensor", "values_strings", "values_int64s",
                                         "values_floats") if node.attr(k) is not None)
    keys, values = np.asarray(keys), np.asarray(values)
    if values.dtype.kind in "OSU":
        default = node.attr("default_string", "_Unused")
        values = values.astype(str).astype(object)
    elif values.dtype.kind == "f":
        default = node.attr("default_float", -0.0)
    else:
        default = node.attr("default_int64", -1)
    if node.attr("default_tensor") is not None:
        default = np.asarray(node.attr("default_tensor")).reshape(-1)[0]
    if keys.dtype.kind in "OSU":
        keys = keys.astype(str).astype(object)
    out_dtype = tf.string if values.dtype == object else tf.as_dtype(values.dtype)
    result = tf.fill(tf.shape(x), tf.constant(default, out_dtype))
    k_tensor = tf.constant(keys, x.dtype)
    for key, value in zip(tf.unstack(k_tensor), values):
        result = tf.where(tf.equal(x, key), tf.constant(value, out_dtype), result)
    return result


_COMPARE = {0: tf.less_equal, 1: tf.less, 2: tf.greater_equal, 3: tf.greater, 4: tf.equal,
            5: tf.not_equal}


@op
def TreeEnsemble(node, x):
    """Each tree's leaf as the AND of the branch conditions on its path; leaves aggregated."""
    a = node.attrs
    splits = np.asarray(a["nodes_splits"]).reshape(-1)
    members = list(np.asarray(a.get("membership_values", [])).reshape(-1))
    missing = a.get("nodes_missing_value_tracks_true")
    leaf_w = np.asarray(a["leaf_weights"]).reshape(-1)
    targets = int(a.get("n_targets", 1))
    batch = tf.shape(x)[0]
    member_sets, it = {}, iter(members)
    for i, mode in enumerate(a["nodes_modes"]):
        if mode == 6:
            values = []
            for v in it:
                if np.isnan(v):
                    break
                values.append(v)
            member_sets[i] = values

    def condition(i):
        col = x[:, a["nodes_featureids"][i]]
        mode = a["nodes_modes"][i]
        if mode == 6:
            hit = tf.reduce_any(tf.equal(col[:, tf.newaxis], tf.constant(
                member_sets[i], x.dtype)[tf.newaxis]), 1)
        else:
            hit = _COMPARE[mode](col, tf.constant(splits[i], x.dtype))
        if missing is not None and missing[i]:
            hit = tf.logical_or(hit, tf.math.is_nan(col))
        return hit

    def leaves(i, is_leaf, path):
        if is_leaf:
            return [(path, leaf_w[i], a["leaf_targetids"][i])]
        c = condition(i)
        return (leaves(a["nodes_truenodeids"][i], a["nodes_trueleafs"][i],
                       tf.logical_and(path, c))
                + leaves(a["nodes_falsenodeids"][i], a["nodes_falseleafs"][i],
                         tf.logical_and(path, tf.logical_not(c))))

    agg = a.get("aggregate_function", 1)
    roots = a["tree_roots"]
    init = {0: 0.0, 1: 0.0, 2: np.finfo(x.dtype.as_numpy_dtype).max,
            3: np.finfo(x.dtype.as_numpy_dtype).min}[agg]
    out = tf.fill([batch, targets], tf.constant(init, x.dtype))
    everyone = tf.ones([batch], tf.bool)
    for root in roots:
        leaf_root = (a["nodes_trueleafs"][root] and a["nodes_falseleafs"][root]
                     and a["nodes_truenodeids"][root] == a["nodes_falsenodeids"][root])
        if leaf_root:
            found = [(everyone, leaf_w[a["nodes_truenodeids"][root]],
                      a["leaf_targetids"][a["nodes_truenodeids"][root]])]
        else:
            found = leaves(root, False, everyone)
        value = tf.zeros([batch, targets], x.dtype)
        for path, weight, target in found:
            onehot = tf.one_hot(target, targets, dtype=x.dtype)
            value += tf.cast(path, x.dtype)[:, tf.newaxis] * weight * onehot
        hit = tf.zeros([batch, targets], tf.bool)
        for path, _, target in found:
            hit = tf.logical_or(hit, tf.logical_and(path[:, tf.newaxis], tf.one_hot(
                target, targets, on_value=True, off_value=False)[tf.newaxis]))
        if agg in (0, 1):
            out += value / (len(roots) if agg == 0 else 1)
        else:
            pick = tf.minimum if agg == 2 else tf.maximum
            out = tf.where(hit, pick(out, value), out)
    return out
