"""``Dataset.sample_from_datasets`` and ``Dataset.choose_from_datasets`` (and their
``td.data.experimental`` forms): selection, ends, cardinality, specs, errors, distribution.

Expected values were observed in TensorFlow 2.21 unless a test says otherwise. The random
order of ``sample_from_datasets`` is numpy's, not TensorFlow's: seeded tests pin
reproducibility and statistics, never TensorFlow's sequence.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import towerdist as td

D = td.data.Dataset
TS = td.TensorSpec
INF = td.data.INFINITE_CARDINALITY
UNK = td.data.UNKNOWN_CARDINALITY

pytestmark = pytest.mark.timeout(60)


def ints(dataset: D, limit: int | None = None) -> list[int]:
    out: list[int] = []
    if limit == 0:
        return out
    for element in dataset:
        out.append(int(element))
        if len(out) == limit:
            break
    return out


def choices(*values: int) -> D:
    return D.from_tensor_slices(np.array(values, dtype=np.int64))


A, B = D.range(3), D.range(10, 13)


# --- sample_from_datasets -------------------------------------------------------------------------


def test_sample_keeps_each_inputs_order_and_every_element():
    out = ints(D.sample_from_datasets([A, B], seed=1))
    assert sorted(out) == [0, 1, 2, 10, 11, 12]
    assert [v for v in out if v < 10] == [0, 1, 2]
    assert [v for v in out if v >= 10] == [10, 11, 12]


def test_sample_is_reproducible_with_a_seed_and_the_same_every_pass():
    # observed in TensorFlow 2.21: with a seed (and rerandomize_each_iteration unset) every pass is the same
    ds = D.sample_from_datasets([D.range(50), D.range(100, 150)], seed=7)
    first = ints(ds)
    assert ints(ds) == first
    assert ints(D.sample_from_datasets([D.range(50), D.range(100, 150)], seed=7)) == first
    assert ints(D.sample_from_datasets([D.range(50), D.range(100, 150)], seed=8)) != first


def test_sample_rerandomizes_each_iteration_when_asked():
    ds = D.sample_from_datasets([D.range(50), D.range(100, 150)], seed=7, rerandomize_each_iteration=True)
    first, second = ints(ds), ints(ds)
    assert first != second
    assert sorted(first) == sorted(second)
    again = D.sample_from_datasets([D.range(50), D.range(100, 150)], seed=7, rerandomize_each_iteration=True)
    assert [ints(again), ints(again)] == [first, second]


def test_sample_without_a_seed_repeats_its_order_across_passes():
    # observed in TensorFlow 2.21: an unseeded sample_from_datasets gives the same order on every pass
    ds = D.sample_from_datasets([D.range(50), D.range(100, 150)])
    assert ints(ds) == ints(ds)


def test_sample_follows_the_weights():
    ds = D.sample_from_datasets([D.from_tensors(0).repeat(), D.from_tensors(1).repeat()], [0.2, 0.8], seed=3)
    counts = collections.Counter(ints(ds, 4000))
    assert 0.76 < counts[1] / 4000 < 0.84  # binomial(4000, 0.8): sd 0.0063, so this is over 6 sd wide


def test_sample_uniform_by_default():
    ds = D.sample_from_datasets([D.from_tensors(i).repeat() for i in range(4)], seed=3)
    counts = collections.Counter(ints(ds, 4000))
    assert all(0.21 < counts[i] / 4000 < 0.29 for i in range(4))


def test_sample_stop_on_empty_dataset_ends_at_the_first_ended_input():
    ds = D.sample_from_datasets([A, B.repeat()], seed=1, stop_on_empty_dataset=True)
    out = ints(ds, 1000)
    assert len(out) < 1000  # it ended: A ran out
    assert [v for v in out if v < 10] == [0, 1, 2]


def test_sample_without_stop_drains_every_input():
    # observed in TensorFlow 2.21: [a, range(0)] gives a's elements
    assert ints(D.sample_from_datasets([A, D.range(0)], seed=1)) == [0, 1, 2]
    # ... and with stop_on_empty_dataset=True it ends as soon as the empty one is drawn
    out = ints(D.sample_from_datasets([D.range(100), D.range(0)], seed=1, stop_on_empty_dataset=True))
    assert out == list(range(len(out))) and len(out) < 100


def test_sample_one_dataset_returns_it():
    # observed in TensorFlow 2.21: the very dataset, its cardinality kept
    assert D.sample_from_datasets([A]) is A
    assert D.sample_from_datasets([A], weights=[1.0]) is A


def test_sample_leaves_out_datasets_of_zero_weight():
    # observed in TensorFlow 2.21: [1.0, 0.0] -> a (cardinality 3); [-1.0, 1.0] -> b; [0.0, 0.0] -> empty
    assert D.sample_from_datasets([A, B], weights=[1.0, 0.0], seed=1) is A
    assert D.sample_from_datasets([A, B], weights=[-1.0, 1.0], seed=1) is B
    none = D.sample_from_datasets([A, B], weights=[0.0, 0.0], seed=1)
    assert ints(none) == []
    assert none.cardinality() == 0


@pytest.mark.parametrize("weights", [[np.nan, 1.0], [-np.inf, 1.0], [-1.0, 1.0]], ids=["nan", "-inf", "negative"])
def test_sample_leaves_out_datasets_of_nan_or_negative_weight(weights):
    # observed in TensorFlow 2.21: [nan, 1.0], [-inf, 1.0] and [-1.0, 1.0] all give b itself (cardinality 3)
    assert D.sample_from_datasets([A, B], weights=weights, seed=1) is B


@pytest.mark.parametrize("weights", [[np.nan, np.nan], [-1.0, -2.0]], ids=["nan", "negative"])
def test_sample_with_no_positive_constant_weight_is_empty(weights):
    # observed in TensorFlow 2.21: cardinality 0, no elements
    none = D.sample_from_datasets([A, B], weights=weights, seed=1)
    assert none.cardinality() == 0
    assert ints(none) == []


@pytest.mark.parametrize("stop", [False, True], ids=["drain", "stop"])
@pytest.mark.parametrize("weights", [[np.inf, 1.0], [np.inf, np.inf], [1.0, np.inf]], ids=["inf-1", "inf-inf", "1-inf"])
def test_sample_an_infinite_constant_weight_is_refused(weights, stop):
    # TensorFlow 2.21 spins forever with [inf, 1.0] (after yielding b's elements, without stop), gives
    # only b's elements (with stop), and raises InvalidArgumentError ("Selector index out of range")
    # for [inf, inf]: towerdist refuses an infinite weight when the dataset is made.
    with pytest.raises(td.errors.InvalidArgumentError, match=r"weights must be finite, but weights\[\d\] is inf"):
        D.sample_from_datasets([A, B], weights=weights, seed=1, stop_on_empty_dataset=stop)


@pytest.mark.parametrize("stop", [False, True], ids=["drain", "stop"])
@pytest.mark.parametrize("vector", [[np.nan, 1.0], [-1.0, 1.0], [-np.inf, 1.0]], ids=["nan", "negative", "-inf"])
def test_sample_a_nan_or_negative_weight_in_a_weights_vector_never_picks_its_dataset(vector, stop):
    # observed in TensorFlow 2.21 with stop_on_empty_dataset=True: b's elements only, then the end
    # (without it TensorFlow keeps drawing the ended b forever from the infinite weights dataset;
    # a finite one ends the result here)
    weights = D.from_tensors(np.array(vector, np.float32)).repeat(20)
    assert ints(D.sample_from_datasets([A, B], weights=weights, seed=1, stop_on_empty_dataset=stop)) == [10, 11, 12]


@pytest.mark.parametrize("vector", [[0.0, 0.0], [np.nan, np.nan], [-1.0, -2.0]], ids=["zeros", "nan", "negative"])
def test_sample_a_weights_vector_without_a_positive_weight_is_an_error(vector):
    # observed in TensorFlow 2.21: InvalidArgumentError ("Selector index out of range: 2 >= 2")
    good = D.from_tensors(np.array([1.0, 1.0], np.float32))
    weights = good.concatenate(D.from_tensors(np.array(vector, np.float32)))
    iterator = iter(D.sample_from_datasets([A, B], weights=weights, seed=1))
    next(iterator)
    with pytest.raises(td.errors.InvalidArgumentError, match=r"needs a positive weight, but element 1 is"):
        next(iterator)


@pytest.mark.parametrize("vector", [[np.inf, 1.0], [np.inf, np.inf]], ids=["inf-1", "inf-inf"])
def test_sample_an_infinite_weight_in_a_weights_vector_is_an_error(vector):
    # TensorFlow 2.21 spins forever with [inf, 1.0] and raises InvalidArgumentError with [inf, inf]
    weights = D.from_tensors(np.array(vector, np.float32)).repeat()
    with pytest.raises(td.errors.InvalidArgumentError, match=r"weights must be finite, but element 0 of the weights"):
        next(iter(D.sample_from_datasets([A, B], weights=weights, seed=1)))


def test_sample_huge_finite_weights_draw_in_proportion():
    # float64 weights whose sum overflows to inf still split the draws evenly
    picks = ints(D.sample_from_datasets([A.repeat(), B.repeat()], weights=np.array([1e308, 1e308]), seed=3), 2000)
    from_a = sum(v < 10 for v in picks)
    assert 850 < from_a < 1150


@pytest.mark.parametrize(
    ("datasets", "stop", "expected"),
    [
        ([A, B], False, UNK),
        ([A, B.filter(lambda x: True)], False, UNK),
        ([A, B.repeat()], False, INF),
        ([A, B.repeat()], True, INF),
        ([A.repeat(), B.repeat()], False, INF),
    ],
    ids=["finite", "unknown", "one-infinite", "one-infinite-stop", "both-infinite"],
)
def test_sample_cardinality(datasets, stop, expected):
    # observed in TensorFlow 2.21: infinite when any input is, even with stop_on_empty_dataset=True
    assert D.sample_from_datasets(datasets, seed=1, stop_on_empty_dataset=stop).cardinality() == expected


def test_sample_with_a_weights_dataset_draws_one_vector_per_element():
    # observed in TensorFlow 2.21: the result ends with the weights dataset
    weights = D.from_tensors(np.array([0.5, 0.5], np.float32)).repeat(2)
    assert len(ints(D.sample_from_datasets([A, B], weights=weights, seed=1))) == 2
    only_b = D.from_tensors(np.array([0.0, 1.0])).repeat()
    assert ints(D.sample_from_datasets([A, B], weights=only_b, seed=1), 3) == [10, 11, 12]


def test_sample_weights_dataset_must_hold_float_vectors():
    # observed in TensorFlow 2.21: TypeError for int32 weights
    with pytest.raises(TypeError, match="weights must be float32 or float64 vectors"):
        D.sample_from_datasets([A, B], weights=D.from_tensors([1, 1]).repeat())


def test_sample_weights_dataset_vectors_must_have_one_weight_per_dataset():
    # TensorFlow 2.21 raises InvalidArgumentError ("Selector index out of range: 2 >= 2") while iterating
    weights = D.from_tensors(np.array([1.0, 1.0, 1.0])).repeat()
    with pytest.raises(td.errors.InvalidArgumentError, match=r"vector of 2 weights.*shape \(3,\)"):
        list(D.sample_from_datasets([A, B], weights=weights, seed=1))


def test_sample_dict_elements():
    # observed in TensorFlow 2.21: compatible dict structures interleave
    ds = D.sample_from_datasets([D.from_tensor_slices({"x": [1, 2]}), D.from_tensor_slices({"x": [3]})], seed=1)
    assert sorted(int(e["x"]) for e in ds) == [1, 2, 3]
    assert ds.element_spec == {"x": TS((), np.int32)}


def test_sample_relaxes_differing_sizes_and_ranks_in_the_spec():
    # observed in TensorFlow 2.21: (2,) and (3,) give (None,); ranks 1 and 0 give an unknown shape
    ds = D.sample_from_datasets([D.from_tensor_slices(np.ones((2, 2))), D.from_tensor_slices(np.ones((2, 3)))], seed=1)
    assert ds.element_spec == TS((None,), np.float64)
    mixed = D.sample_from_datasets([D.from_tensor_slices(np.ones((2, 2))), D.from_tensor_slices(np.ones(2))], seed=1)
    assert mixed.element_spec == TS(None, np.float64)


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (D.range(3, output_type=np.int32), "must have compatible element specs"),
        (D.from_tensor_slices((np.ones(2), np.ones(2))), "must have compatible element specs"),
    ],
    ids=["dtype", "structure"],
)
def test_sample_incompatible_datasets_are_a_type_error(other, match):
    # observed in TensorFlow 2.21: "Invalid `datasets`. `datasets` must have compatible element specs."
    with pytest.raises(TypeError, match=match):
        D.sample_from_datasets([A, other], seed=1)


def lazy(value) -> D:
    """Two elements ``value``: a dataset whose spec is known only by running it."""
    return D.from_generator(lambda: iter([value, value]))


@pytest.mark.parametrize(
    "make",
    [
        lambda datasets: D.sample_from_datasets(datasets, seed=1),
        lambda datasets: D.choose_from_datasets(datasets, choices(0, 0, 1, 1)),
    ],
    ids=["sample", "choose"],
)
@pytest.mark.parametrize(
    "datasets",
    [lambda: [A, lazy(np.float32(1.0))], lambda: [lazy(np.float32(1.0)), A], lambda: [lazy(1), lazy(np.float32(1.0))]],
    ids=["lazy-second", "lazy-first", "both-lazy"],
)
def test_incompatible_datasets_known_only_by_running_are_a_type_error(make, datasets):
    # TensorFlow 2.21 raises TypeError ("`datasets` must have compatible element specs") when the
    # dataset is made; towerdist learns a generator's spec by running it, so it raises at that
    # input's first element instead of mixing the dtypes.
    with pytest.raises(TypeError, match=r"datasets must have compatible element specs .* differ at the top level: dtype"):
        list(make(datasets()))


def test_compatible_datasets_known_only_by_running_mix():
    assert sorted(ints(D.sample_from_datasets([A, lazy(np.int64(7))], seed=1))) == [0, 1, 2, 7, 7]
    assert ints(D.choose_from_datasets([lazy(np.int64(5)), lazy(np.int64(6))], choices(0, 1, 0))) == [5, 6, 5]


def test_sample_argument_errors():
    # observed in TensorFlow 2.21 (the types; messages are towerdist's)
    with pytest.raises(ValueError, match="datasets should not be empty"):
        D.sample_from_datasets([])
    with pytest.raises(TypeError, match=r"datasets\[1\] is a list"):
        D.sample_from_datasets([A, [1, 2]])
    with pytest.raises(ValueError, match=r"len\(weights\)=1 vs. len\(datasets\)=2"):
        D.sample_from_datasets([A, B], weights=[1.0])
    with pytest.raises(TypeError, match="weights must be float32 or float64, but they are int"):
        D.sample_from_datasets([A, B], weights=[1, 1])
    with pytest.raises(TypeError, match="integer seed"):
        D.sample_from_datasets([A, B], seed=1.5)


def test_sample_an_error_in_an_input_comes_out_with_its_type():
    def boom(x):
        raise KeyError("input broke")

    with pytest.raises(KeyError, match="input broke"):
        list(D.sample_from_datasets([A, B.map(boom)], weights=[0.5, 0.5], seed=1))


def test_experimental_sample_from_datasets():
    # observed in TensorFlow 2.21: the same as the method
    ds = td.data.experimental.sample_from_datasets([A, B], seed=4)
    assert ints(ds) == ints(D.sample_from_datasets([A, B], seed=4))


# --- choose_from_datasets -------------------------------------------------------------------------


def test_choose_takes_the_chosen_inputs_elements():
    # observed in TensorFlow 2.21
    ds = D.choose_from_datasets([A, B, D.range(20, 25)], choices(0, 1, 1, 0, 2))
    assert ints(ds) == [0, 10, 11, 1, 20]
    assert ds.cardinality() == UNK


def test_choose_documented_example():
    # tf.data.Dataset.choose_from_datasets' documented example
    datasets = [D.from_tensors(b"foo").repeat(), D.from_tensors(b"bar").repeat(), D.from_tensors(b"baz").repeat()]
    choice = D.range(3).repeat(3)
    out = list(D.choose_from_datasets(datasets, choice))
    assert out == [b"foo", b"bar", b"baz"] * 3


def test_choose_stops_at_an_ended_input_by_default():
    # observed in TensorFlow 2.21
    assert ints(D.choose_from_datasets([A, B], choices(0, 0, 0, 0, 1, 1))) == [0, 1, 2]
    assert ints(D.choose_from_datasets([A, B], D.range(2).repeat())) == [0, 10, 1, 11, 2, 12]


def test_choose_skips_ended_inputs_without_stop():
    # observed in TensorFlow 2.21
    ds = D.choose_from_datasets([A, B], choices(0, 0, 0, 0, 1, 1), stop_on_empty_dataset=False)
    assert ints(ds) == [0, 1, 2, 10, 11]


@pytest.mark.parametrize("bad", [5, -1])
def test_choose_index_out_of_range_after_the_elements_before_it(bad):
    # observed in TensorFlow 2.21: InvalidArgumentError "Selector index out of range: 5 >= 2"
    iterator = iter(D.choose_from_datasets([A, B], choices(0, bad, 1)))
    assert int(next(iterator)) == 0
    with pytest.raises(td.errors.InvalidArgumentError, match=f"selector index out of range.*is {bad}"):
        next(iterator)


def test_choose_with_one_dataset_still_checks_indices():
    # observed in TensorFlow 2.21: "Selector index out of range: 1 >= 1"
    with pytest.raises(td.errors.InvalidArgumentError, match="selector index out of range"):
        list(D.choose_from_datasets([A], D.range(2)))


@pytest.mark.parametrize(
    ("datasets", "choice", "expected"),
    [
        ([A.repeat(), B], D.range(2).repeat(), INF),
        ([A.repeat(), B.repeat()], D.range(2), INF),
        ([A, B], D.range(2).filter(lambda x: True), UNK),
    ],
    ids=["infinite-input", "finite-choice", "unknown"],
)
def test_choose_cardinality(datasets, choice, expected):
    # observed in TensorFlow 2.21: only the data inputs count
    assert D.choose_from_datasets(datasets, choice).cardinality() == expected


def test_choose_infinite_result_can_end():
    # observed in TensorFlow 2.21: cardinality INFINITE, yet the choices end after 2
    ds = D.choose_from_datasets([A.repeat(), B.repeat()], D.range(2))
    assert ints(ds) == [0, 10]


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        (D.from_tensor_slices(np.array([0, 1], np.int32)), "must be int64 scalars"),
        (D.from_tensor_slices(np.array([[0, 1]], np.int64)), "must be int64 scalars"),
    ],
    ids=["int32", "vector"],
)
def test_choose_choice_dataset_must_hold_int64_scalars(choice, match):
    # observed in TensorFlow 2.21: TypeError "Elements of `choice_dataset` must be scalar `tf.int64` tensors"
    with pytest.raises(TypeError, match=match):
        D.choose_from_datasets([A, B], choice)


def test_choose_choice_dataset_checked_while_iterating_when_its_spec_is_not_static():
    choice = D.range(2).map(lambda x: x.astype(np.int32))
    with pytest.raises(TypeError, match="element 0 is"):
        list(D.choose_from_datasets([A, B], choice))


def test_choose_argument_errors():
    # observed in TensorFlow 2.21
    with pytest.raises(TypeError, match="choice_dataset should be a td.data.Dataset, but is a list"):
        D.choose_from_datasets([A, B], [0, 1])
    with pytest.raises(ValueError, match="datasets should not be empty"):
        D.choose_from_datasets([], D.range(2))


def test_experimental_choose_from_datasets_does_not_stop_by_default():
    # observed in TensorFlow 2.21: tf.data.experimental.choose_from_datasets has stop_on_empty_dataset=False
    ds = td.data.experimental.choose_from_datasets([A, B], choices(0, 0, 0, 0, 1))
    assert ints(ds) == [0, 1, 2, 10]


def test_closing_early_closes_the_inputs():
    closed = []

    def gen():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    source = D.from_generator(gen, output_signature=TS((), np.int64))
    iterator = iter(D.choose_from_datasets([source, B], D.range(2).repeat()))
    assert [int(next(iterator)) for _ in range(3)] == [0, 10, 1]
    iterator.close()
    assert closed == [True]


# --- distribution ---------------------------------------------------------------------------------


def _steps(strategy, dist) -> list:
    return [[np.asarray(p).tolist() for p in strategy.experimental_local_results(step)] for step in dist]


def test_distribute_dataset_of_chosen_batches(mirrored_strategy):
    ds = D.choose_from_datasets([D.range(4).batch(2), D.range(10, 13).batch(3)], choices(1, 0, 0))
    assert _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds)) == [
        [[10, 11], [12]],
        [[0], [1]],
        [[2], [3]],
    ]


def test_distribute_dataset_of_sampled_rows_batched(mirrored_strategy):
    ds = D.sample_from_datasets([D.range(5), D.range(10, 15)], seed=2).batch(4)
    rows = [
        v for step in _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds)) for p in step for v in p
    ]
    assert rows == ints(D.sample_from_datasets([D.range(5), D.range(10, 15)], seed=2))
    steps = _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds))
    assert [len(p) for p in steps[-1]] == [1, 1]  # the partial last global batch of 2 rows


def test_distribute_datasets_from_function_with_sampling(mirrored_strategy):
    def dataset_fn(ctx):
        return D.sample_from_datasets([D.range(6), D.range(10, 16)], seed=5).batch(ctx.get_per_replica_batch_size(4))

    steps = _steps(mirrored_strategy, mirrored_strategy.distribute_datasets_from_function(dataset_fn))
    expected = ints(D.sample_from_datasets([D.range(6), D.range(10, 16)], seed=5))
    assert [v for step in steps for piece in step for v in piece] == expected
    assert len(steps) == 3
