"""String operators in TensorFlow (tf.string tensors)."""

from __future__ import annotations

import tensorflow as tf

from d500.backends.graph import registry

OPS, op = registry()


@op
def StringConcat(node, a, b):
    shape = tf.broadcast_dynamic_shape(tf.shape(a), tf.shape(b))
    return tf.strings.join([tf.broadcast_to(a, shape), tf.broadcast_to(b, shape)])


@op
def RegexFullMatch(node, x):
    return tf.strings.regex_full_match(x, node.attr("pattern"))


@op
def StringSplit(node, x):
    """Substrings padded with "" to the longest split, and the number of substrings."""
    delimiter = node.attr("delimiter") or None
    maxsplit = node.attr("maxsplit")
    maxsplit = -1 if maxsplit is None else maxsplit
    if delimiter is None:  # runs of whitespace, no empty strings
        parts = tf.strings.split(tf.strings.strip(x), maxsplit=maxsplit)
        parts = tf.ragged.boolean_mask(parts, tf.strings.length(parts) > 0)
    else:
        parts = tf.strings.split(x, sep=delimiter, maxsplit=maxsplit)
    lengths = tf.cast(parts.row_lengths(axis=-1), tf.int64)
    padded = parts.to_tensor(default_value="")
    width = tf.maximum(tf.shape(padded)[-1], 1) if x.shape.rank else tf.shape(padded)[-1]
    padded = padded[..., :width]
    return padded, lengths


@op
def StringNormalizer(node, x):
    """Stopwords removed (case-(in)sensitively), then the case changed, as ONNX says."""
    action = node.attr("case_change_action", "NONE")
    sensitive = node.attr("is_case_sensitive", 0)
    stops = node.attr("stopwords") or []
    flat = tf.reshape(x, [-1])
    keep = tf.ones_like(flat, tf.bool)
    if stops:
        probe = flat if sensitive else tf.strings.lower(flat)
        words = stops if sensitive else [w.lower() for w in stops]
        for w in words:
            keep = tf.logical_and(keep, tf.not_equal(probe, w))
    kept = tf.boolean_mask(flat, keep)
    if action == "LOWER":
        kept = tf.strings.lower(kept)
    elif action == "UPPER":
        kept = tf.strings.upper(kept)
    kept = tf.cond(tf.size(kept) > 0, lambda: kept, lambda: tf.constant([""]))
    return tf.reshape(kept, [1, -1]) if x.shape.rank == 2 else kept


@op
def TfIdfVectorizer(node, x):
    """Counts of the pool's n-grams (with skips) per row, weighted by mode TF, IDF or TFIDF."""
    pool = node.attr("pool_int64s")
    pool = list(node.attr("pool_strings")) if pool is None else list(pool)
    starts = list(node.attr("ngram_counts"))
    indexes = list(node.attr("ngram_indexes"))
    lo, hi = node.attr("min_gram_length"), node.attr("max_gram_length")
    max_skip = node.attr("max_skip_count", 0)
    weights = node.attr("weights")
    mode = node.attr("mode", "TF")
    rows = x if x.shape.rank == 2 else x[tf.newaxis]
    if rows.dtype != tf.string:
        rows = tf.cast(rows, tf.int64)
    length = rows.shape[1]
    width = max(indexes) + 1 if indexes else 0
    columns = []
    k = 0  # n-gram number in pool order
    for n in range(1, len(starts) + 1):
        begin = starts[n - 1]
        end = starts[n] if n < len(starts) else len(pool)
        grams = [pool[i:i + n] for i in range(begin, end, n)]
        for gram in grams:
            if lo <= n <= hi:
                total = tf.zeros([rows.shape[0]], tf.float32)
                for skip in range(max_skip + 1 if n > 1 else 1):
                    step = skip + 1
                    count = length - (n - 1) * step
                    if count <= 0:
                        continue
                    hit = tf.ones([rows.shape[0], count], tf.bool)
                    for j, token in enumerate(gram):
                        part = rows[:, j * step:j * step + count]
                        hit = tf.logical_and(hit, tf.equal(part, tf.constant(token, part.dtype)))
                    total += tf.reduce_sum(tf.cast(hit, tf.float32), 1)
                columns.append((indexes[k], k, total))
            k += 1
    out = tf.zeros([rows.shape[0], width], tf.float32)
    for column, number, total in columns:
        if mode == "IDF":
            total = tf.where(total > 0, 1.0, 0.0) * (weights[number] if weights else 1.0)
        elif mode == "TFIDF" and weights:
            total = total * weights[number]
        onehot = tf.one_hot(column, width, dtype=tf.float32)
        out += total[:, tf.newaxis] * onehot[tf.newaxis]
    return out if x.shape.rank == 2 else out[0]
