"""``td.data.Options``: option groups, aliases, type checks, merging, and a dataset's options.

Every expected value is TensorFlow 2.21's, observed by running the same code there (its
messages are quoted where a test pins the error class).
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import D

Options = td.data.Options
Policy = td.data.experimental.AutoShardPolicy


def _options(**settings):
    """Options with ``settings`` set; ``"group.name"`` keys set an option of a group."""
    options = Options()
    for key, value in settings.items():
        target = options
        *groups, name = key.split(".")
        for group in groups:
            target = getattr(target, group)
        setattr(target, name, value)
    return options


# --- the option groups -------------------------------------------------------------------------

# TF 2.21: sorted public fields of each group's class.
GROUPS = [
    (
        "experimental_optimization",
        "OptimizationOptions",
        [
            "apply_default_optimizations",
            "filter_fusion",
            "filter_parallelization",
            "inject_prefetch",
            "map_and_batch_fusion",
            "map_and_filter_fusion",
            "map_fusion",
            "map_parallelization",
            "noop_elimination",
            "parallel_batch",
            "seq_interleave_prefetch",
            "shuffle_and_repeat_fusion",
        ],
    ),
    ("threading", "ThreadingOptions", ["max_intra_op_parallelism", "private_threadpool_size"]),
    (
        "autotune",
        "AutotuneOptions",
        ["autotune_algorithm", "cpu_budget", "enabled", "initial_parallelism", "min_parallelism", "ram_budget"],
    ),
    ("experimental_distribute", "DistributeOptions", ["auto_shard_policy", "num_devices"]),
    ("experimental_service", "ServiceOptions", ["pinned"]),
]


@pytest.mark.parametrize("attribute, class_name, fields", GROUPS, ids=[g[0] for g in GROUPS])
def test_option_groups_are_objects_with_tensorflows_fields(attribute, class_name, fields):
    group = getattr(Options(), attribute)
    assert type(group).__name__ == class_name
    assert type(group) is getattr(td.data.experimental, class_name)
    assert sorted(k for k in dir(type(group)) if not k.startswith("_")) == fields


def test_options_has_tensorflows_fields():
    assert sorted(k for k in dir(Options) if not k.startswith("_")) == [
        "autotune",
        "dataset_name",
        "deterministic",
        "experimental_deterministic",
        "experimental_distribute",
        "experimental_external_state_policy",
        "experimental_optimization",
        "experimental_service",
        "experimental_slack",
        "experimental_symbolic_checkpoint",
        "experimental_threading",
        "experimental_warm_start",
        "framework_type",
        "merge",
        "threading",
    ]
    assert td.data.ThreadingOptions is td.data.experimental.ThreadingOptions


def test_unset_options_read_none():
    o = Options()
    assert (
        o.deterministic,
        o.experimental_deterministic,
        o.experimental_optimization.map_parallelization,
        o.threading.private_threadpool_size,
        o.autotune.enabled,
        o.experimental_distribute.num_devices,
        o.experimental_slack,
        o.dataset_name,
        o.framework_type,
        o.experimental_warm_start,
        o.experimental_symbolic_checkpoint,
        o.experimental_external_state_policy,
    ) == (None,) * 12
    assert o.experimental_distribute.auto_shard_policy is Policy.AUTO


def test_group_objects_are_not_shared_between_options():
    a, b = Options(), Options()
    a.experimental_optimization.map_fusion = True
    a.threading.private_threadpool_size = 2
    assert b.experimental_optimization.map_fusion is None  # TF 2.21: None, None, False
    assert b.threading.private_threadpool_size is None
    assert a.experimental_optimization is not b.experimental_optimization


# --- deprecated names ----------------------------------------------------------------------------


@pytest.mark.parametrize("set_name", ["deterministic", "experimental_deterministic"])
def test_experimental_deterministic_is_deterministic(set_name):
    o = Options()
    setattr(o, set_name, False)
    assert (o.deterministic, o.experimental_deterministic) == (False, False)


def test_experimental_threading_is_threading():
    o = Options()
    assert o.experimental_threading is o.threading
    o.experimental_threading = td.data.experimental.ThreadingOptions()
    o.experimental_threading.private_threadpool_size = 3
    assert o.threading.private_threadpool_size == 3


def test_a_group_can_be_replaced_by_an_object_of_its_class():
    o = Options()
    o.experimental_optimization = td.data.experimental.OptimizationOptions()
    o.threading = td.data.ThreadingOptions()
    assert type(o.threading).__name__ == "ThreadingOptions"


# --- type checks and unknown names ------------------------------------------------------------------

# TF 2.21: each raises TypeError('Property "<name>" must be of type <type>, got: ...').
BAD_VALUES = [
    ("deterministic", 1),
    ("deterministic", None),
    ("experimental_optimization.map_fusion", "yes"),
    ("experimental_optimization.map_and_batch_fusion", None),
    ("threading.private_threadpool_size", 2.0),
    ("threading.private_threadpool_size", np.int64(2)),
    ("experimental_distribute.auto_shard_policy", 1),
    ("experimental_external_state_policy", 1),
    ("experimental_external_state_policy", None),
    ("experimental_optimization", None),
    ("experimental_distribute", 3),
    ("dataset_name", 3),
    ("experimental_symbolic_checkpoint", 1),
]


@pytest.mark.parametrize("key, value", BAD_VALUES, ids=[f"{k}={v!r}" for k, v in BAD_VALUES])
def test_a_value_of_another_type_is_a_type_error(key, value):
    name = key.split(".")[-1]
    with pytest.raises(TypeError, match=f'Property "{name}" of td.data.[A-Za-z]*Options must be of type'):
        _options(**{key: value})


def test_an_int_is_accepted_where_a_bool_is_an_int():
    # TF 2.21: True (bool is a subclass of int, and TF checks isinstance).
    assert _options(**{"threading.private_threadpool_size": True}).threading.private_threadpool_size is True


def test_a_type_error_names_the_enum_member_to_pass():
    with pytest.raises(TypeError, match=r"pass td.data.experimental.ExternalStatePolicy.IGNORE"):
        Options().experimental_external_state_policy = 1


@pytest.mark.parametrize("target", ["", "experimental_optimization"])
def test_an_unknown_option_is_an_attribute_error(target):
    # TF 2.21: AttributeError('Cannot set the property bogus on Options.') (OptimizationOptions for a group).
    o = Options()
    holder = getattr(o, target) if target else o
    with pytest.raises(AttributeError, match=f"Cannot set the property bogus on {type(holder).__name__}"):
        holder.bogus = 1


def test_an_unknown_option_suggests_the_close_name():
    with pytest.raises(AttributeError, match="did you mean 'deterministic'"):
        Options().determinstic = True


def test_reading_an_unknown_option_is_an_attribute_error():
    with pytest.raises(AttributeError):
        Options().bogus  # noqa: B018


# --- comparing and merging ---------------------------------------------------------------------------


def test_equality_compares_the_values():
    assert Options() == Options()
    assert _options(**{"experimental_optimization.map_fusion": True}) != Options()
    assert _options(deterministic=True) != Options()  # TF 2.21: set True != unset
    assert (Options() == 3) is False


def test_merge_takes_the_later_objects_set_values():
    merged = _options(deterministic=False).merge(_options(**{"experimental_optimization.map_fusion": True}))
    assert (merged.deterministic, merged.experimental_optimization.map_fusion) == (False, True)


def test_merge_conflict_the_later_value_wins():
    a, b = _options(deterministic=False), _options(deterministic=True)
    assert (a.merge(b).deterministic, b.merge(a).deterministic) == (True, False)  # TF 2.21


def test_merge_returns_a_new_object_and_leaves_both():
    a, b = _options(deterministic=False), _options(deterministic=True)
    merged = a.merge(b)
    assert merged is not a and merged is not b
    assert (a.deterministic, b.deterministic) == (False, True)
    merged.threading.private_threadpool_size = 4
    assert b.threading.private_threadpool_size is None


def test_merge_a_default_value_does_not_override():
    a = _options(**{"experimental_distribute.auto_shard_policy": Policy.OFF})
    b = _options(**{"experimental_distribute.auto_shard_policy": Policy.AUTO})
    assert a.merge(b).experimental_distribute.auto_shard_policy is Policy.OFF  # TF 2.21: OFF both ways
    assert b.merge(a).experimental_distribute.auto_shard_policy is Policy.OFF


def test_merge_is_recursive_in_the_groups():
    a = _options(**{"experimental_optimization.map_fusion": True})
    b = _options(**{"experimental_optimization.map_fusion": False, "experimental_optimization.noop_elimination": True})
    merged = a.merge(b).experimental_optimization
    assert (merged.map_fusion, merged.noop_elimination) == (False, True)  # TF 2.21


def test_merge_joins_framework_types():
    assert _options(framework_type=["x"]).merge(_options(framework_type=["y"])).framework_type == ["x", "y"]


@pytest.mark.parametrize("other", [3, td.data.experimental.DistributeOptions()], ids=["int", "group"])
def test_merge_with_something_else_is_a_type_error(other):
    with pytest.raises(TypeError, match="Could not merge incompatible options"):
        Options().merge(other)


# --- the options of a dataset ----------------------------------------------------------------------------


def test_later_with_options_wins():
    ds = D.range(3).with_options(_options(deterministic=False)).with_options(_options(deterministic=True))
    assert ds.options().deterministic is True


def test_with_options_twice_merges():
    ds = (
        D.range(3)
        .with_options(_options(deterministic=False))
        .map(lambda x: x)
        .with_options(_options(**{"experimental_optimization.map_fusion": True}))
    )
    assert (ds.options().deterministic, ds.options().experimental_optimization.map_fusion) == (False, True)


def test_concatenate_takes_either_inputs_options():
    ds = D.range(3).with_options(_options(deterministic=False))
    assert D.range(3).concatenate(ds).options().deterministic is False
    assert ds.concatenate(D.range(3)).options().deterministic is False


@pytest.mark.parametrize(
    "combine",
    [lambda a, b: a.concatenate(b), lambda a, b: D.zip((a, b)), lambda a, b: D.zip(a, b)],
    ids=["concatenate", "zip_tuple", "zip_args"],
)
def test_the_later_inputs_options_win(combine):
    a, b = D.range(3).with_options(_options(deterministic=False)), D.range(3).with_options(_options(deterministic=True))
    assert combine(a, b).options().deterministic is True  # TF 2.21: (True, False)
    assert combine(b, a).options().deterministic is False


@pytest.mark.parametrize(
    "combine", [lambda a, b: a.concatenate(b), lambda a, b: D.zip((a, b))], ids=["concatenate", "zip"]
)
def test_the_inputs_options_merge(combine):
    a = D.range(3).with_options(_options(deterministic=False))
    b = D.range(3).with_options(_options(**{"threading.private_threadpool_size": 2}))
    options = combine(a, b).options()
    assert (options.deterministic, options.threading.private_threadpool_size) == (False, 2)


def test_with_options_after_zip_merges_with_the_inputs():
    a, b = D.range(3).with_options(_options(deterministic=False)), D.range(3).with_options(_options(deterministic=True))
    ds = D.zip((a, b)).with_options(_options(**{"threading.private_threadpool_size": 2}))
    assert ds.options().deterministic is True


def test_datasets_made_by_interleave_do_not_contribute():
    ds = D.range(3).with_options(_options(deterministic=False))
    inner = ds.interleave(lambda x: D.range(2).with_options(_options(deterministic=True)))
    assert inner.options().deterministic is False


def test_sampled_inputs_contribute():
    a = D.range(3).with_options(_options(deterministic=False))
    assert D.sample_from_datasets([D.range(2), a], seed=1).options().deterministic is False
    assert D.choose_from_datasets([D.range(2), a], D.range(2)).options().deterministic is False


@pytest.mark.parametrize("key", ["deterministic", "experimental_optimization.map_fusion"])
def test_a_datasets_options_are_read_only(key):
    # TF 2.21: ValueError('Mutating `tf.data.Options()` returned by `tf.data.Dataset.options()` has no effect. ...')
    options = D.range(3).options()
    with pytest.raises(ValueError, match=r"Mutating `td.data.Options\(\)` returned by `td.data.Dataset.options\(\)`"):
        *groups, name = key.split(".")
        target = options
        for group in groups:
            target = getattr(target, group)
        setattr(target, name, False)


def test_changing_options_after_with_options_does_not_reach_the_dataset():
    options = _options(deterministic=False)
    ds = D.range(3).with_options(options)
    options.deterministic = True
    options.threading.private_threadpool_size = 3
    assert ds.options().deterministic is False  # TF 2.21
    assert ds.options().threading.private_threadpool_size is None


def test_a_datasets_options_can_be_given_to_another():
    source = D.range(3).with_options(_options(deterministic=False))
    ds = D.range(4).with_options(source.options())
    assert ds.options().deterministic is False
    assert ds.options() == source.options()


def test_a_dataset_zipped_with_itself_merges_once():
    ds = D.range(3).with_options(_options(deterministic=False))
    for _ in range(30):  # each level would double the work if the shared input were merged twice
        ds = D.zip((ds, ds))
    assert ds.options().deterministic is False


def test_repr_shows_the_set_options():
    assert repr(Options()) == "Options()"
    shown = repr(_options(deterministic=False, **{"threading.private_threadpool_size": 2}))
    assert shown == "Options(deterministic=False, threading=ThreadingOptions(private_threadpool_size=2))"
