"""``td.data``: cardinality, element specs (``TensorSpec``) and options.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import INF, UNK, D, rows

# --- cardinality ---------------------------------------------------------------------------------


def _shuffled():
    return D.range(10).shuffle(4, seed=0)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: D.range(10), 10),
        (lambda: D.range(10).batch(3), 4),
        (lambda: D.range(10).batch(3, drop_remainder=True), 3),
        (lambda: D.range(10).filter(lambda x: True), UNK),
        (lambda: D.range(10).repeat(), INF),
        (lambda: D.range(10).repeat(3), 30),
        (lambda: D.range(10).repeat(0), 0),
        (lambda: D.range(10).take(3), 3),
        (lambda: D.range(10).skip(3), 7),
        (lambda: D.range(10).skip(30), 0),
        (lambda: D.range(10).repeat().take(5), 5),
        (lambda: D.range(10).repeat().skip(5), INF),
        (lambda: D.range(10).take(-1), 10),
        (lambda: D.range(10).skip(-1), 0),
        (lambda: D.range(10).shard(3, 0), 4),
        (lambda: D.range(10).shard(3, 1), 3),
        (lambda: D.range(10).shard(3, 2), 3),
        (lambda: D.range(10).batch(3).unbatch(), UNK),
        (lambda: D.from_generator(lambda: iter([1]), output_signature=td.TensorSpec((), td.int32)), UNK),
        (lambda: D.zip(D.range(3), D.range(5)), 3),
        (lambda: D.zip(D.range(3).repeat(), D.range(5)), 5),
        (lambda: D.zip(D.range(3).repeat(), D.range(5).repeat()), INF),
        (lambda: D.range(10).enumerate(), 10),
        (lambda: D.range(10).cache(), 10),
        (_shuffled, 10),
        (lambda: D.range(10).map(lambda x: x), 10),
        (lambda: D.range(10).prefetch(2), 10),
        (lambda: D.range(0).repeat(), 0),
        (lambda: D.range(10).filter(lambda x: True).repeat(3), UNK),
        (lambda: D.range(10).filter(lambda x: True).repeat(), INF),
        (lambda: D.range(10).repeat().batch(4), INF),
        (lambda: D.range(10).repeat().shard(2, 1), INF),
        (lambda: D.range(10).repeat().take(0), 0),
        (lambda: D.from_tensors([1, 2]), 1),
        (lambda: D.range(10).with_options(td.data.Options()), 10),
    ],
)
def test_cardinality(make, expected):
    ds = make()
    n = ds.cardinality()
    assert isinstance(n, np.int64)
    assert n == expected


@pytest.mark.parametrize(
    "make",
    [lambda: D.range(10).repeat(3), lambda: D.range(10).shard(3, 2), lambda: D.range(10).batch(4).take(2)],
)
def test_cardinality_matches_element_count(make):
    ds = make()
    assert ds.cardinality() == len(list(ds))


def test_cardinality_constants():
    assert td.data.INFINITE_CARDINALITY == -1 == td.data.experimental.INFINITE_CARDINALITY
    assert td.data.UNKNOWN_CARDINALITY == -2 == td.data.experimental.UNKNOWN_CARDINALITY


def test_cardinality_skip_all_of_infinite_stays_infinite():
    assert D.range(3).repeat().skip(-1).cardinality() == INF


def test_len_of_finite():
    assert len(D.range(10).batch(3)) == 4
    assert len(D.range(0)) == 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: D.range(3).repeat(), "The dataset is infinite"),
        (lambda: D.range(3).filter(lambda x: True), "The dataset length is unknown"),
    ],
)
def test_len_of_infinite_or_unknown(make, message):
    with pytest.raises(TypeError, match=message):
        len(make())


def test_empty_dataset_is_truthy():
    assert bool(D.range(0)) is True


# --- element_spec and TensorSpec -----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, text",
    [
        (td.TensorSpec((None, 1), td.float32), "TensorSpec(shape=(None, 1), dtype=tf.float32, name=None)"),
        (td.TensorSpec((), td.int64), "TensorSpec(shape=(), dtype=tf.int64, name=None)"),
        (td.TensorSpec([3], td.string, name="s"), "TensorSpec(shape=(3,), dtype=tf.string, name='s')"),
        (td.TensorSpec((2, None, 4), td.bool), "TensorSpec(shape=(2, None, 4), dtype=tf.bool, name=None)"),
        (td.TensorSpec((5,)), "TensorSpec(shape=(5,), dtype=tf.float32, name=None)"),
    ],
)
def test_tensor_spec_repr_like_tensorflow(spec, text):
    assert repr(spec) == text


def test_tensor_spec_repr_unknown_rank():
    assert repr(td.TensorSpec(None, td.float32)) == "TensorSpec(shape=<unknown>, dtype=tf.float32, name=None)"


def test_element_spec_of_batched_repeat():
    spec = D.from_tensors(([1.0], [2])).repeat(100).batch(16).element_spec
    assert spec == (td.TensorSpec((None, 1), td.float32), td.TensorSpec((None, 1), td.int32))
    assert repr(spec) == (
        "(TensorSpec(shape=(None, 1), dtype=tf.float32, name=None), "
        "TensorSpec(shape=(None, 1), dtype=tf.int32, name=None))"
    )


def test_tensor_spec_properties():
    spec = td.TensorSpec([None, 2], td.int32, name="x")
    assert spec.shape == (None, 2)
    assert spec.dtype == np.int32
    assert spec.rank == 2
    assert spec.name == "x"
    assert td.TensorSpec(None).rank is None


@pytest.mark.parametrize(
    "other, expected",
    [
        (td.TensorSpec((3, 2), td.float32), True),
        (td.TensorSpec((None, 2), td.float32), True),
        (td.TensorSpec(None, td.float32), True),
        (td.TensorSpec((3, 2), td.float32, name="other"), True),
        (td.TensorSpec((3, 3), td.float32), False),
        (td.TensorSpec((3, 2), td.float64), False),
        (np.zeros((7, 2), np.float32), True),
        (np.zeros((7, 2), np.float64), False),
        (np.zeros((7, 2, 1), np.float32), False),
    ],
)
def test_tensor_spec_is_compatible_with(other, expected):
    assert td.TensorSpec((None, 2), td.float32).is_compatible_with(other) is expected


def test_tensor_spec_equality_and_hash():
    a = td.TensorSpec((None, 2), td.float32)
    b = td.TensorSpec([None, 2], np.float32)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != td.TensorSpec((None, 2), td.float32, name="n")
    assert a != td.TensorSpec((None, 3), td.float32)
    assert a != td.TensorSpec((None, 2), td.int32)
    assert a != "TensorSpec"


def test_tensor_spec_from_tensor():
    assert td.TensorSpec.from_tensor(np.zeros((2, 3), np.int16)) == td.TensorSpec((2, 3), td.int16)


def test_dataset_repr_shows_spec():
    assert repr(D.range(3)) == "<RangeDataset element_spec=TensorSpec(shape=(), dtype=tf.int64, name=None)>"


# --- options ---------------------------------------------------------------------------------------


def test_options_default_auto():
    assert td.data.Options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO
    assert D.range(3).options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


@pytest.mark.parametrize("name, value", [("OFF", -1), ("AUTO", 0), ("FILE", 1), ("DATA", 2), ("HINT", 3)])
def test_auto_shard_policy_values(name, value):
    policy = getattr(td.data.experimental.AutoShardPolicy, name)
    assert int(policy) == value
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    ds = D.range(6).with_options(options).batch(2).map(lambda x: x)
    assert ds.options().experimental_distribute.auto_shard_policy == policy
    assert rows(ds) == [[0, 1], [2, 3], [4, 5]]


def test_auto_shard_policy_refuses_an_int_and_names_the_member():
    # TF 2.21: TypeError: Property "auto_shard_policy" must be of type <enum 'AutoShardPolicy'>, got: 2
    options = td.data.Options()
    with pytest.raises(
        TypeError, match=r'"auto_shard_policy" .*must be of type AutoShardPolicy.*AutoShardPolicy\.DATA'
    ):
        options.experimental_distribute.auto_shard_policy = 2
    assert options.experimental_distribute.auto_shard_policy is td.data.experimental.AutoShardPolicy.AUTO


@pytest.mark.parametrize("value", [7, "DATA", None])
def test_auto_shard_policy_invalid(value):
    options = td.data.Options()
    with pytest.raises(TypeError, match='Property "auto_shard_policy" of td.data.DistributeOptions must be of type'):
        options.experimental_distribute.auto_shard_policy = value
    assert options.experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


@pytest.mark.parametrize("value", [None, {"auto_shard_policy": 1}])
def test_with_options_needs_options(value):
    with pytest.raises(TypeError, match=r"with_options\(\) takes a td.data.Options"):
        D.range(3).with_options(value)


def test_options_do_not_leak_to_the_input():
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
    base = D.range(3)
    base.with_options(options)
    assert base.options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


def test_later_with_options_overrides_earlier():
    policy = td.data.experimental.AutoShardPolicy
    off, data = td.data.Options(), td.data.Options()
    off.experimental_distribute.auto_shard_policy = policy.OFF
    data.experimental_distribute.auto_shard_policy = policy.DATA
    ds = D.range(3).with_options(off).map(lambda x: x).with_options(data)
    assert ds.options().experimental_distribute.auto_shard_policy == policy.DATA
