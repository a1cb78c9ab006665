"""``Dataset.rejection_resample`` and the TF 2.21 parameters of ``map`` and ``reduce``."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

D = td.data.Dataset


def classes(dataset: td.data.Dataset) -> collections.Counter[int]:
    return collections.Counter(int(c) for c, _ in dataset)


def skewed(n: int = 400) -> td.data.Dataset:
    """Classes 0, 0, 0, 1 repeated: 75% / 25%."""
    return D.from_tensor_slices(np.array([0, 0, 0, 1], dtype=np.int32)).repeat(n)


def test_elements_are_class_element_pairs_with_tensorflows_spec():
    # TensorFlow 2.21: element_spec (TensorSpec((), tf.int32), <input spec>); elements (class, element).
    ds = D.from_tensor_slices(np.arange(8, dtype=np.float32)).rejection_resample(
        lambda x: (x % 2).astype(np.int32), target_dist=[0.5, 0.5], seed=3
    )
    assert ds.element_spec == (td.TensorSpec((), np.int32), td.TensorSpec((), np.float32))
    pairs = list(ds)
    assert pairs and all(c.dtype == np.int32 and c.shape == () for c, _ in pairs)
    assert all(int(c) == int(x) % 2 for c, x in pairs)
    assert ds.cardinality() == td.data.UNKNOWN_CARDINALITY


@pytest.mark.parametrize("initial", [None, [0.75, 0.25]], ids=["estimated", "given"])
def test_the_kept_classes_follow_the_target(initial):
    counts = classes(skewed().rejection_resample(lambda x: x, [0.5, 0.5], initial_dist=initial, seed=0))
    total = counts[0] + counts[1]
    assert abs(counts[0] / total - 0.5) < 0.06, counts


def labelled(n_blocks: int = 50) -> td.data.Dataset:
    """``(class, position)`` pairs, classes 0, 0, 0, 1 repeated (75% / 25%)."""
    labels = np.array([0, 0, 0, 1] * n_blocks, np.int32)
    return D.from_tensor_slices((labels, np.arange(labels.size)))


def resampled_runs(initial, target=(0.5, 0.5), seeds=range(20)) -> list[list[tuple[int, int]]]:
    return [
        [(int(c), int(e[1])) for c, e in labelled().rejection_resample(lambda c, i: c, list(target), initial, seed)]
        for seed in seeds
    ]


def test_a_given_initial_dist_mixes_original_elements_in():
    # observed in TensorFlow 2.21, 200 elements 75% / 25% to a balanced target: 147, 180 and 139
    # elements (seeds 0-2), balanced, about 30 of them output twice. Two thirds of the draws
    # (min target/initial) take the next input element; the rest the next element of class 1.
    runs = resampled_runs([0.75, 0.25])
    assert 135 <= np.mean([len(run) for run in runs]) <= 165
    assert all(sum(1 for c, _ in run if c == 1) >= 50 for run in runs)  # the filtered stream ran out
    assert all(len(run) > len({i for _, i in run}) for run in runs)  # some elements come out twice
    counts = collections.Counter(c for run in runs for c, _ in run)
    assert abs(counts[0] / (counts[0] + counts[1]) - 0.5) < 0.05, counts


def test_an_estimated_initial_dist_mixes_original_elements_in():
    # observed in TensorFlow 2.21, same input, no initial_dist: 170, 187 and 165 elements (seeds
    # 0-2), at most 224 (the estimate is made per 32 elements and serves 32 draws: 7 * 32)
    runs = resampled_runs(None)
    assert 160 <= np.mean([len(run) for run in runs]) <= 195
    assert max(len(run) for run in runs) <= 224


def test_the_output_ends_when_the_original_stream_runs_out():
    # observed in TensorFlow 2.21, target [0.7, 0.3] from [0.75, 0.25]: 216, 210 and 213 elements,
    # every one of the 150 elements of class 0 (only the original stream has them)
    for run in resampled_runs([0.75, 0.25], target=(0.7, 0.3), seeds=range(3)):
        assert sorted(i for c, i in run if c == 0) == [i for i in range(200) if i % 4 != 3]


def test_an_input_that_follows_the_target_comes_out_whole():
    # observed in TensorFlow 2.21: initial_dist == target_dist gives all 200 elements, in order
    (run,) = resampled_runs([0.75, 0.25], target=(0.75, 0.25), seeds=[0])
    assert [i for _, i in run] == list(range(200))


@pytest.mark.parametrize(
    ("dtype", "initial"),
    [(np.int32, None), (np.int64, None), (np.int32, [0.75, 0.25]), (np.int64, [0.75, 0.25]), (np.int16, [0.75, 0.25])],
)
def test_the_class_keeps_class_funcs_dtype(dtype, initial):
    # observed in TensorFlow 2.21: the class component has class_func's dtype (int16 needs initial_dist)
    ds = skewed(2).rejection_resample(lambda x: dtype(x), [0.5, 0.5], initial_dist=initial, seed=0)
    assert ds.element_spec == (td.TensorSpec((), dtype), td.TensorSpec((), np.int32))
    assert {type(c) for c, _ in ds} == {dtype}


@pytest.mark.parametrize(
    ("dtype", "initial"),
    [(np.int16, None), (np.uint8, None), (np.int8, [0.75, 0.25]), (np.uint32, None), (np.float32, [0.75, 0.25])],
)
def test_a_class_of_another_dtype_is_a_type_error(dtype, initial):
    # observed in TensorFlow 2.21: TypeError "Value passed to parameter 'indices' has DataType ..."
    ds = skewed(1).rejection_resample(lambda x: dtype(x), [0.5, 0.5], initial_dist=initial, seed=0)
    with pytest.raises(TypeError, match="class_func must return an int"):
        list(ds)


def test_a_seed_makes_runs_reproducible_and_iterations_repeat():
    ds = skewed(50).rejection_resample(lambda x: x, [0.5, 0.5], seed=7)
    first = [(int(c), int(x)) for c, x in ds]
    assert first == [(int(c), int(x)) for c, x in ds]
    other = [(int(c), int(x)) for c, x in skewed(50).rejection_resample(lambda x: x, [0.5, 0.5], seed=8)]
    assert first != other


def test_a_class_absent_from_the_target_is_dropped():
    counts = classes(skewed(20).rejection_resample(lambda x: x, [1.0, 0.0], initial_dist=[0.75, 0.25], seed=0))
    assert counts == {0: 60}


def test_tuple_elements_are_passed_to_class_func_as_arguments():
    ds = D.from_tensor_slices((np.array([0, 1], np.int32), np.array([5.0, 6.0]))).rejection_resample(
        lambda label, value: label, [0.5, 0.5], initial_dist=[0.5, 0.5], seed=0
    )
    assert [(int(c), int(lbl), float(v)) for c, (lbl, v) in ds] == [(0, 0, 5.0), (1, 1, 6.0)]


def test_the_experimental_form_is_a_transformation_for_apply():
    ds = skewed(5).apply(td.data.experimental.rejection_resample(lambda x: x, [0.5, 0.5], seed=1))
    assert sum(classes(ds).values()) > 0


@pytest.mark.parametrize(
    "target, initial, message",
    [
        ([[0.5, 0.5]], None, "non-empty vector"),
        ([], None, "non-empty vector"),
        ([1.0, -0.1], None, "non-negative"),
        ([0.0, 0.0], None, "positive sum"),
        ([0.5, float("nan")], None, "finite"),
        ([0.5, 0.5], [1.0], "same length"),
    ],
)
def test_bad_distributions_are_refused_when_built(target, initial, message):
    with pytest.raises(td.errors.InvalidArgumentError, match=message):
        skewed(1).rejection_resample(lambda x: x, target, initial_dist=initial)


@pytest.mark.parametrize(
    "class_func, message",
    [
        (lambda x: x + 2, "class 2 for element 0, outside \\[0, 2\\)"),
        (lambda x: np.array([x, x]), "integer scalar; it returned int32 of shape \\(2,\\)"),
    ],
)
def test_a_bad_class_is_refused_naming_the_element(class_func, message):
    ds = skewed(1).rejection_resample(class_func, [0.5, 0.5], seed=0)
    with pytest.raises(td.errors.InvalidArgumentError, match=message):
        list(ds)


def test_an_error_in_class_func_names_the_element():
    def fails(x):
        raise KeyError("no class")

    with pytest.raises(KeyError) as info:
        list(skewed(1).rejection_resample(fails, [0.5, 0.5]))
    assert any("raised by class_func on element 0" in note for note in info.value.__notes__)


def test_bad_arguments_are_type_errors():
    with pytest.raises(TypeError, match="callable class_func"):
        skewed(1).rejection_resample(3, [0.5, 0.5])
    with pytest.raises(TypeError, match="integer seed"):
        skewed(1).rejection_resample(lambda x: x, [0.5, 0.5], seed=1.5)


@settings(max_examples=30, deadline=None)
@given(
    labels=st.lists(st.integers(0, 2), min_size=1, max_size=60),
    target=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).filter(lambda t: sum(t) > 0.01),
    seed=st.integers(0, 2**31 - 1),
)
def test_output_elements_are_input_elements_with_their_classes(labels, target, seed):
    data = np.array(labels, dtype=np.int32)
    kept = [(int(c), int(x)) for c, x in D.from_tensor_slices(data).rejection_resample(lambda x: x, target, seed=seed)]
    # Every output is an input element with its class, never of a zero-target class; the
    # original and filtered streams are two passes, so an element comes out at most twice.
    assert all(c == x and target[c] > 0 for c, x in kept)
    assert len(kept) <= 32 * -(-len(labels) // 32)
    assert all(count <= 2 * labels.count(x) for x, count in collections.Counter(x for _, x in kept).items())


def test_rejection_resample_through_a_strategy():
    from towerdist.testing.pytest_plugin import mirrored_strategy_for

    strategy = mirrored_strategy_for(2)
    ds = skewed(16).rejection_resample(lambda x: x, [0.5, 0.5], seed=2).map(lambda c, x: c).batch(4)
    steps = [strategy.experimental_local_results(x) for x in strategy.experimental_distribute_dataset(ds)]
    flat = [int(v) for step in steps for part in step for v in np.asarray(part)]
    assert flat == [int(c) for c, _ in skewed(16).rejection_resample(lambda x: x, [0.5, 0.5], seed=2)]
    assert all(len(step) == 2 for step in steps)


# --- map(synchronous=, use_unbounded_threadpool=) and reduce(name=) --------------------------


def test_map_takes_tensorflows_synchronous_and_thread_pool_parameters():
    double = lambda x: x * 2  # noqa: E731
    expected = [0, 2, 4, 6]
    assert [int(x) for x in D.range(4).map(double, synchronous=True)] == expected
    assert [int(x) for x in D.range(4).map(double, synchronous=False, num_parallel_calls=2)] == expected
    assert [int(x) for x in D.range(4).map(double, num_parallel_calls=2, use_unbounded_threadpool=True)] == expected


@pytest.mark.parametrize("calls", [2, td.data.AUTOTUNE])
def test_map_refuses_synchronous_with_parallel_calls_as_tensorflow_does(calls):
    # TensorFlow 2.21: ValueError "`synchronous` is not supported with `num_parallel_calls`, ...".
    with pytest.raises(ValueError, match="`synchronous` is not supported with `num_parallel_calls`"):
        D.range(4).map(lambda x: x, num_parallel_calls=calls, synchronous=True)


def test_reduce_takes_a_name():
    assert int(D.range(4).reduce(np.int64(0), lambda s, x: s + x, name="total")) == 6
