"""``Dataset.element_spec`` after batching, rebatching, windowing and the other operations.

Every expected spec is TensorFlow 2.21's, printed by running the same pipeline there on CPU
(``tf.fill`` there is ``np.full`` here).
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import D


def TS(shape, dtype):
    return td.TensorSpec(shape, dtype)


def DatasetSpecOf(spec):
    return ("DatasetSpec", spec)


def _fill(shape, x):
    return np.full([int(v) for v in shape], x)


def R(n=10):
    return D.range(n)


def _as_compared(spec):
    """The spec, with a window's ``DatasetSpec`` as ("DatasetSpec", its elements' spec)."""
    if type(spec).__name__ == "DatasetSpec":
        return ("DatasetSpec", spec.element_spec)
    return spec


CASES = [
    ("rebatch [2,2] from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch([2, 2]), TS((2,), "int64")),
    ("rebatch [2,2] from 4", lambda: R(16).batch(4).rebatch([2, 2]), TS((None,), "int64")),
    ("rebatch 2 from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch(2), TS((2,), "int64")),
    (
        "rebatch 2 drop from drop4",
        lambda: R(16).batch(4, drop_remainder=True).rebatch(2, drop_remainder=True),
        TS((2,), "int64"),
    ),
    ("rebatch 2 drop from 4", lambda: R(16).batch(4).rebatch(2, drop_remainder=True), TS((2,), "int64")),
    ("rebatch 3 from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch(3), TS((None,), "int64")),
    (
        "rebatch 3 drop from drop4",
        lambda: R(16).batch(4, drop_remainder=True).rebatch(3, drop_remainder=True),
        TS((3,), "int64"),
    ),
    ("rebatch [1,3] from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch([1, 3]), TS((None,), "int64")),
    (
        "rebatch [2,2] drop from drop4",
        lambda: R(16).batch(4, drop_remainder=True).rebatch([2, 2], drop_remainder=True),
        TS((2,), "int64"),
    ),
    (
        "rebatch [2,0,2] from drop4",
        lambda: R(16).batch(4, drop_remainder=True).rebatch([2, 0, 2]),
        TS((None,), "int64"),
    ),
    ("rebatch [4] from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch([4]), TS((4,), "int64")),
    ("rebatch 8 from drop4", lambda: R(16).batch(4, drop_remainder=True).rebatch(8), TS((None,), "int64")),
    (
        "rebatch 8 drop from drop4",
        lambda: R(16).batch(4, drop_remainder=True).rebatch(8, drop_remainder=True),
        TS((8,), "int64"),
    ),
    (
        "rebatch tuple",
        lambda: D.zip((R(16), R(16))).batch(4, drop_remainder=True).rebatch([2, 2]),
        (TS((2,), "int64"), TS((2,), "int64")),
    ),
    ("unbatch drop", lambda: R(9).batch(3, drop_remainder=True).unbatch(), TS((), "int64")),
    ("unbatch 2d", lambda: R(12).batch(3, drop_remainder=True).batch(2).unbatch(), TS((3,), "int64")),
    ("batch", lambda: R().batch(3), TS((None,), "int64")),
    ("batch drop", lambda: R().batch(3, drop_remainder=True), TS((3,), "int64")),
    ("batch inf", lambda: R().repeat().batch(3), TS((None,), "int64")),
    ("batch drop inf", lambda: R().repeat().batch(3, drop_remainder=True), TS((3,), "int64")),
    ("padded_batch", lambda: R().map(lambda x: _fill([x], x)).padded_batch(2), TS((None, None), "int64")),
    (
        "padded_batch drop",
        lambda: R().map(lambda x: _fill([x], x)).padded_batch(2, drop_remainder=True),
        TS((2, None), "int64"),
    ),
    (
        "padded_batch shapes",
        lambda: R().map(lambda x: _fill([x], x)).padded_batch(2, padded_shapes=[12]),
        TS((None, 12), "int64"),
    ),
    ("window", lambda: R().window(3), DatasetSpecOf(TS((), "int64"))),
    (
        "window flat batch",
        lambda: R().window(3, drop_remainder=True).flat_map(lambda w: w.batch(3)),
        TS((None,), "int64"),
    ),
    (
        "window flat batch drop",
        lambda: R().window(3, drop_remainder=True).flat_map(lambda w: w.batch(3, drop_remainder=True)),
        TS((3,), "int64"),
    ),
    ("map batch", lambda: R().batch(2, drop_remainder=True).map(lambda x: x * 2), TS((2,), "int64")),
    ("from_tensors", lambda: D.from_tensors([[1, 2]]), TS((1, 2), "int32")),
    ("slices", lambda: D.from_tensor_slices([[1, 2], [3, 4]]), TS((2,), "int32")),
    (
        "zip batch",
        lambda: D.zip((R().batch(2), R().batch(2, drop_remainder=True))),
        (TS((None,), "int64"), TS((2,), "int64")),
    ),
    (
        "concat batch same",
        lambda: R().batch(2, drop_remainder=True).concatenate(R().batch(2, drop_remainder=True)),
        TS((2,), "int64"),
    ),
    (
        "concat batch diff",
        lambda: R().batch(2, drop_remainder=True).concatenate(R().batch(3, drop_remainder=True)),
        TS((None,), "int64"),
    ),
    (
        "group_by_window",
        lambda: R().group_by_window(lambda x: x % 2, lambda k, w: w.batch(2), window_size=2),
        TS((None,), "int64"),
    ),
    (
        "group_by_window drop",
        lambda: R().group_by_window(lambda x: x % 2, lambda k, w: w.batch(2, drop_remainder=True), window_size=2),
        TS((2,), "int64"),
    ),
    (
        "bucket",
        lambda: (
            R().map(lambda x: _fill([x % 3 + 1], x)).bucket_by_sequence_length(lambda x: np.shape(x)[0], [2], [2, 2])
        ),
        TS((None, None), "int64"),
    ),
    (
        "bucket drop",
        lambda: (
            R()
            .map(lambda x: _fill([x % 3 + 1], x))
            .bucket_by_sequence_length(lambda x: np.shape(x)[0], [2], [2, 2], drop_remainder=True)
        ),
        TS((None, None), "int64"),
    ),
    (
        "bucket pad_to_bucket",
        lambda: (
            R()
            .map(lambda x: _fill([x % 3 + 1], x))
            .bucket_by_sequence_length(lambda x: np.shape(x)[0], [2], [2, 2], pad_to_bucket_boundary=True)
        ),
        TS((None, None), "int64"),
    ),
    ("scan", lambda: R().batch(2, drop_remainder=True).scan(np.int64(0), lambda s, x: (s + 1, x)), TS((2,), "int64")),
    ("shuffle batch", lambda: R().batch(2, drop_remainder=True).shuffle(3), TS((2,), "int64")),
    ("cache batch", lambda: R().batch(2, drop_remainder=True).cache().prefetch(1), TS((2,), "int64")),
    ("enumerate", lambda: R().batch(2, drop_remainder=True).enumerate(), (TS((), "int64"), TS((2,), "int64"))),
    (
        "sample",
        lambda: D.sample_from_datasets([R().batch(2, drop_remainder=True), R().batch(2, drop_remainder=True)]),
        TS((2,), "int64"),
    ),
    (
        "sample diff",
        lambda: D.sample_from_datasets([R().batch(2, drop_remainder=True), R().batch(3, drop_remainder=True)]),
        TS((None,), "int64"),
    ),
    (
        "choose",
        lambda: D.choose_from_datasets([R().batch(2, drop_remainder=True), R().batch(3)], D.range(2)),
        TS((None,), "int64"),
    ),
    (
        "rejection",
        lambda: R().batch(2, drop_remainder=True).rejection_resample(lambda x: np.int32(x[0] % 2), [0.5, 0.5], seed=1),
        (TS((), "int32"), TS((2,), "int64")),
    ),
    ("take_while", lambda: R().batch(2, drop_remainder=True).take_while(lambda x: x[0] < 5), TS((2,), "int64")),
    ("ignore_errors", lambda: R().batch(2, drop_remainder=True).ignore_errors(), TS((2,), "int64")),
    ("interleave", lambda: R(3).interleave(lambda x: R().batch(2, drop_remainder=True)), TS((2,), "int64")),
    ("shard", lambda: R().batch(2, drop_remainder=True).shard(2, 0), TS((2,), "int64")),
    ("unbatch rebatch", lambda: R(16).batch(4, drop_remainder=True).rebatch([2, 2]).unbatch(), TS((), "int64")),
    ("random", lambda: D.random(seed=1), TS((), "int64")),
    ("counter", lambda: D.counter(), TS((), "int64")),
    (
        "generator",
        lambda: D.from_generator(lambda: iter([[1, 2]]), output_signature=td.TensorSpec((None,), td.int64)).batch(
            2, drop_remainder=True
        ),
        TS((2, None), "int64"),
    ),
]


@pytest.mark.parametrize("make, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_element_spec_matches_tensorflow(make, expected):
    assert _as_compared(make().element_spec) == expected


def test_rebatch_of_a_static_batch_into_equal_pieces_keeps_a_static_batch_size():
    # The case. TF 2.21: TensorSpec(shape=(2,), dtype=tf.int64); each batch has 2 rows.
    ds = D.range(16).batch(4, drop_remainder=True).rebatch([2, 2])
    assert ds.element_spec == td.TensorSpec((2,), td.int64)
    assert [len(b) for b in ds] == [2] * 8


def test_padded_batch_after_map_leaves_the_padded_dimensions_unknown():
    # Decided difference (docs/concepts.md): TF 2.21 gives (None, 3), knowing from tracing that
    # every row has 3 values; here map's shapes come from one call, so padded dimensions stay None.
    ds = R().map(lambda x: _fill([3], x)).padded_batch(2)
    assert ds.element_spec == td.TensorSpec((None, None), td.int64)
