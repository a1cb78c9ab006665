"""``sample_from_datasets`` and ``choose_from_datasets``: one dataset drawing from several.

Both are TensorFlow's *directed interleave*: a selector picks, for every output element,
the input to take it from. ``choose_from_datasets`` reads the selector from a dataset of
int64 indices; ``sample_from_datasets`` draws it at random with the given weights (from a
list, or one weight vector per draw from a dataset). When a picked input has run out,
``stop_on_empty_dataset=True`` ends the result; otherwise that pick is dropped and the
input is never picked again (for constant weights: the draw is among the inputs left,
which is the same distribution).

Weights, as in TensorFlow: a constant weight that is 0, negative or NaN leaves its dataset
out; in a vector of a weights dataset such a weight never picks its dataset in that draw, and
a vector with no positive weight is an ``InvalidArgumentError`` (TensorFlow's "Selector index
out of range"). An infinite weight is an ``InvalidArgumentError`` (TensorFlow spins forever on
``[inf, 1.0]`` once the other input has ended, and fails on ``[inf, inf]``).

The random stream is numpy's (``np.random.default_rng``), so a seeded run is reproducible
from run to run, but its order differs from TensorFlow's for the same seed. Without a seed,
one is drawn for the process; a saved iterator carries it, so a restored run (in another
process too) draws as the saved one would have.

Cardinality, as in TensorFlow: infinite when any input is infinite (even with
``stop_on_empty_dataset=True``, where the result may in fact end), unknown otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np

from towerdist._src import nest
from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import Cursor, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.seeds import Seeded
from towerdist._src.data.spec import ElementSpec, FirstElementCheck, TensorSpec, common_spec, dtype_name, structure_of
from towerdist._src.data.structure import close_iterator
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import name_api, unworded, worded_at
from towerdist._src.type_aliases import TensorLike

__all__ = ["ChooseFromDatasets", "SampleFromDatasets", "choose_from_datasets", "sample_from_datasets"]

INFINITE, UNKNOWN = options_lib.INFINITE, options_lib.UNKNOWN
_END = object()

# What ``sample_from_datasets`` draws by: one float weight per dataset (a list, tuple or vector),
# or a dataset of such vectors, one per draw.
Weights: TypeAlias = "Sequence[float] | np.ndarray | Dataset"


def _mixed_spec(specs: Sequence[ElementSpec], name: str = "datasets") -> ElementSpec:
    """The spec of elements drawn from datasets of ``specs`` (:func:`spec.common_spec`).

    Raises:
      TypeError: the structures or dtypes differ.
    """
    first_leaves, treespec = nest.flatten(specs[0])
    for index, spec in enumerate(specs[1:], start=1):
        leaves, other = nest.flatten(spec)
        if other != treespec or not all(
            isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.dtype == b.dtype
            for a, b in zip(first_leaves, leaves, strict=True)
        ):
            raise unworded(
                TypeError(
                    f"{name} must have compatible element specs (the same structure and dtypes). "
                    f"Dataset 0 element_spec={specs[0]!r}; dataset {index} element_spec={spec!r}."
                )
            )
    return common_spec(specs)


def _check_datasets(datasets: Sequence[Dataset]) -> list[Dataset]:
    if isinstance(datasets, Dataset) or not isinstance(datasets, (list, tuple)):
        raise unworded(TypeError(f"takes a list of td.data.Dataset. Got datasets={datasets!r}."))
    if not datasets:
        raise unworded(ValueError(f"datasets should not be empty. Got datasets={datasets!r}."))
    for index, dataset in enumerate(datasets):
        if not isinstance(dataset, Dataset):
            raise unworded(
                TypeError(
                    f"takes a list of td.data.Dataset, but datasets[{index}] is a {type(dataset).__name__}: "
                    f"{dataset!r}."
                )
            )
    specs = [d._spec(probe=False) for d in datasets]
    if all(spec is not None for spec in specs):
        _mixed_spec(specs)  # incompatible inputs fail now, as in TensorFlow
    return list(datasets)


def _seed(seed: int | None) -> int | None:
    if seed is None:
        return None  # drawn for this process (see seeds)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise unworded(TypeError(f"takes an integer seed. Got seed={seed!r}."))
    return int(seed) & (2**64 - 1)


class _DirectedInterleave(Dataset):
    """Takes each element from the input the selector names; ``_inputs`` are the data inputs, then the selector."""

    _api: str
    _num: int  # how many data inputs
    _stop: bool

    def _spec(self, probe: bool) -> ElementSpec:
        specs = [d._spec(probe) for d in self._inputs[: self._num]]
        if any(spec is None for spec in specs):
            return None
        with worded_at(self._api):
            return _mixed_spec(specs)

    def _cardinality(self) -> int:
        counts = [d._cardinality() for d in self._inputs[: self._num]]
        return INFINITE if INFINITE in counts else UNKNOWN

    def _picks(self, state: State) -> Iterator[int]:
        """The selector: the index of the input for every next element.

        It keeps its position in ``state`` whenever it yields (a selector started afresh over
        a restored state goes on from there); ``state.alive`` says which inputs have not ended.
        """
        raise NotImplementedError

    def _start_picks(self, state: State) -> None:
        """Sets up the selector's position for a new pass (the random ones draw their epoch now)."""

    def _mismatch(self, a: int, spec_a: ElementSpec, b: int, spec_b: ElementSpec, where: str) -> str:
        return (
            f"{self._api} datasets must have compatible element specs (the same structure and dtypes), but their "
            f"elements differ {where}: dataset {a} element_spec={spec_a!r}; dataset {b} element_spec={spec_b!r}."
        )

    def _state_params(self) -> dict[str, Any]:
        return {"datasets": self._num}

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: ``alive``, which inputs have not ended; ``unchecked``, the inputs whose
        # first element is still to be checked against the others' (specs known only by
        # running), and ``reference``, the first such element's spec; the selector's position
        # (see _picks); and the passes over the inputs picked so far (children "0", "1", ...;
        # an input that ended is dropped).
        if not state.resumed:
            state.alive = [True] * self._num
            state.unchecked = [d._spec(probe=False) is None for d in self._inputs[: self._num]]
            state.reference = None
            self._start_picks(state)
        return self._interleaved(state)

    def _interleaved(self, state: State) -> Iterator[Any]:
        alive: list[bool] = state.alive
        unchecked: list[bool] = state.unchecked
        iterators: list[Cursor | None] = [None] * self._num
        check = FirstElementCheck(self._mismatch)
        if any(unchecked):
            for key, dataset in enumerate(self._inputs[: self._num]):
                check.known(key, dataset._spec(probe=False))
            if state.reference is not None:
                check.known(*state.reference)  # (only taken when no input's spec is static)
        picks = self._picks(state)
        try:
            for index in picks:
                if not alive[index]:
                    continue  # a pick of an input that ended: dropped (TensorFlow's rule)
                iterator = iterators[index]
                if iterator is None:
                    iterator = iterators[index] = state.input(index)
                element = next(iterator, _END)
                if element is _END:
                    if self._stop:
                        return
                    alive[index] = False
                    iterators[index] = None
                    state.drop(str(index))
                    if not any(alive):
                        return
                    continue
                if unchecked[index]:
                    spec = structure_of(element)
                    check.spec(index, spec)
                    unchecked[index] = False
                    if state.reference is None:
                        state.reference = (index, spec)
                yield element
        except BaseException as error:
            name_api(error, self._api)
            raise
        finally:
            close_iterator(picks)
            for iterator in iterators:
                if iterator is not None:
                    iterator.close()


class SampleFromDatasets(Seeded, _DirectedInterleave):
    def __init__(
        self,
        datasets: list[Dataset],
        # Any: a float vector or a dataset of them. sample_from_datasets converts a list and drops None
        # first, in branches its one call expression cannot show a checker (np.ndarray | Dataset is exact).
        weights: Any,
        seed: int | None,
        stop_on_empty_dataset: bool,
        rerandomize_each_iteration: bool,
    ) -> None:
        self._api = "Dataset.sample_from_datasets()"
        self._num = len(datasets)
        self._stop = bool(stop_on_empty_dataset)
        self._weights = weights if not isinstance(weights, Dataset) else None
        self._inputs = (*datasets, weights) if isinstance(weights, Dataset) else tuple(datasets)
        self._init_seed(seed)
        self._rerandomize = bool(rerandomize_each_iteration)

    def _start_picks(self, state: State) -> None:
        # The selector's position: the random generator, the unused uniforms drawn for picks,
        # and (with a weights dataset) how many weight vectors were read.
        state.epoch = self._seeds.next_epoch() if self._rerandomize else 0
        state.rng = np.random.default_rng([self._seed, state.epoch])
        state.uniforms, state.vectors = [], 0

    def _picks(self, state: State) -> Iterator[int]:
        rng: np.random.Generator = state.rng
        uniforms: list[float] = state.uniforms

        def uniform() -> float:
            if not uniforms:
                uniforms.extend(rng.random(256).tolist())
            return uniforms.pop()

        if self._weights is not None:
            yield from self._constant_picks(self._weights, state.alive, uniform)
            return
        source = state.input(self._num)
        try:
            for position, vector in enumerate(source, start=state.vectors):
                pick = _draw(self._weight_vector(vector, position), uniform())
                state.vectors = position + 1
                yield pick
        finally:
            source.close()

    def _constant_picks(self, weights: np.ndarray, alive: list[bool], uniform: Callable[[], float]) -> Iterator[int]:
        # Drawing among the inputs left is the distribution of TensorFlow's "draw among all,
        # drop picks of ended inputs", without the wasted draws.
        live = weights.copy()
        while True:
            if self._stop:
                yield _draw(weights, uniform())
                continue
            for index, up in enumerate(alive):
                if not up:
                    live[index] = 0.0
            if not live.any():
                return
            yield _draw(live, uniform())

    def _weight_vector(self, vector: TensorLike, position: int) -> np.ndarray:
        array = np.asarray(vector)
        if array.dtype not in (np.float32, np.float64):
            raise unworded(
                TypeError(
                    f"weights must be float32 or float64, but element {position} of the weights dataset is "
                    f"{dtype_name(array.dtype)}."
                )
            )
        if array.shape != (self._num,):
            raise unworded(
                InvalidArgumentError(
                    f"every element of the weights dataset must be a vector of {self._num} weights (one per "
                    f"dataset), but element {position} has shape {array.shape}."
                )
            )
        weights = array.astype(np.float64)
        if np.isposinf(weights).any():
            raise unworded(
                InvalidArgumentError(
                    f"weights must be finite, but element {position} of the weights dataset is "
                    f"{weights.tolist()}; scale the weights down (only their ratios matter)."
                )
            )
        # As in TensorFlow, a NaN or negative weight gives its dataset no chance in that draw.
        weights[~(weights > 0)] = 0.0
        if not weights.any():
            raise unworded(
                InvalidArgumentError(
                    f"every element of the weights dataset needs a positive weight, but element {position} "
                    f"is {array.tolist()}. (TensorFlow raises 'Selector index out of range' here.)"
                )
            )
        return weights


def _draw(weights: np.ndarray, u: float) -> int:
    """The index ``u`` (uniform in [0, 1)) falls on when [0, 1) is cut in proportion to ``weights``.

    ``weights`` are finite, non-negative and not all zero (checked where they come in).
    """
    cumulative = np.cumsum(weights / weights.max())  # scaled so that a sum of huge weights stays finite
    return min(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), len(weights) - 1)


def sample_from_datasets(
    datasets: Sequence[Dataset],
    weights: Weights | None = None,
    seed: int | None = None,
    stop_on_empty_dataset: bool = False,
    rerandomize_each_iteration: bool | None = None,
) -> Dataset:
    """See ``Dataset.sample_from_datasets``."""
    inputs = _check_datasets(datasets)
    seed_value = _seed(seed)
    if weights is None:
        constant: np.ndarray | None = np.full(len(inputs), 1.0 / len(inputs))
    elif isinstance(weights, Dataset):
        constant = None
        spec = weights._spec(probe=False)
        if spec is not None:
            leaves, _ = nest.flatten(spec)
            if (
                len(leaves) != 1
                or not isinstance(leaves[0], TensorSpec)
                or leaves[0].dtype not in (np.float32, np.float64)
            ):
                raise unworded(
                    TypeError(
                        f"weights must be float32 or float64 vectors, but the weights dataset has element_spec "
                        f"{spec!r}."
                    )
                )
    else:
        constant = _constant_weights(weights, len(inputs))
        # TensorFlow drops the datasets of constant weight <= 0 before sampling.
        kept = [i for i, w in enumerate(constant.tolist()) if w > 0]
        if not kept:
            return inputs[0].take(0)
        inputs = [inputs[i] for i in kept]
        constant = constant[kept]
    if len(inputs) == 1:
        return inputs[0]  # TensorFlow returns the only dataset itself
    return SampleFromDatasets(
        inputs,
        constant if constant is not None else weights,
        seed_value,
        stop_on_empty_dataset,
        bool(rerandomize_each_iteration),
    )


def _constant_weights(weights: Sequence[float] | np.ndarray, count: int) -> np.ndarray:
    values = list(weights) if isinstance(weights, (list, tuple)) else weights
    array = np.asarray(values)
    if isinstance(weights, (list, tuple)) and all(isinstance(w, float) for w in weights):
        array = array.astype(np.float32)  # Python floats are float32 in TensorFlow
    if array.ndim != 1 or array.shape[0] != count:
        raise unworded(
            ValueError(
                f"weights should have the same length as datasets, but got len(weights)="
                f"{array.shape[0] if array.ndim else 'a scalar'} vs. len(datasets)={count}."
            )
        )
    if array.dtype not in (np.float32, np.float64):
        raise unworded(
            TypeError(
                f"weights must be float32 or float64, but they are {dtype_name(array.dtype)}: {weights!r}. Give "
                f"floats (e.g. [0.5, 0.5])."
            )
        )
    infinite = [index for index, w in enumerate(array.tolist()) if w == math.inf]
    if infinite:
        raise unworded(
            InvalidArgumentError(
                f"weights must be finite, but weights[{infinite[0]}] is inf: weights={weights!r}. Give finite "
                f"weights (only their ratios matter; a weight of 0 never picks its dataset)."
            )
        )
    return array.astype(np.float64)


class ChooseFromDatasets(_DirectedInterleave):
    def __init__(self, datasets: list[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool) -> None:
        self._api = "Dataset.choose_from_datasets()"
        self._num = len(datasets)
        self._stop = bool(stop_on_empty_dataset)
        self._inputs = (*datasets, choice_dataset)

    def _start_picks(self, state: State) -> None:
        state.choices = 0  # how many elements of choice_dataset were read

    def _picks(self, state: State) -> Iterator[int]:
        source = state.input(self._num)
        try:
            for position, choice in enumerate(source, start=state.choices):
                array = np.asarray(choice) if isinstance(choice, (np.ndarray, np.generic)) else None
                if array is None or array.dtype != np.int64 or array.ndim != 0:
                    raise unworded(
                        TypeError(
                            f"the elements of choice_dataset must be int64 scalars, but element {position} is "
                            f"{choice!r}."
                        )
                    )
                index = int(array)
                if not 0 <= index < self._num:
                    raise unworded(
                        InvalidArgumentError(
                            f"selector index out of range: element {position} of choice_dataset is {index}, "
                            f"but there are {self._num} datasets (indices 0 to {self._num - 1})."
                        )
                    )
                state.choices = position + 1
                yield index
        finally:
            source.close()


def choose_from_datasets(
    datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = True
) -> Dataset:
    """See ``Dataset.choose_from_datasets``."""
    inputs = _check_datasets(datasets)
    if not isinstance(choice_dataset, Dataset):
        raise unworded(
            TypeError(f"choice_dataset should be a td.data.Dataset, but is a {type(choice_dataset).__name__}.")
        )
    spec = choice_dataset._spec(probe=False)
    if spec is not None and spec != TensorSpec((), np.int64):
        raise unworded(TypeError(f"the elements of choice_dataset must be int64 scalars, but are {spec!r}."))
    return ChooseFromDatasets(inputs, choice_dataset, stop_on_empty_dataset)


def experimental_sample_from_datasets(
    datasets: Sequence[Dataset],
    weights: Weights | None = None,
    seed: int | None = None,
    stop_on_empty_dataset: bool = False,
) -> Dataset:
    """``tf.data.experimental.sample_from_datasets``: the same as ``Dataset.sample_from_datasets``."""
    with worded_at("Dataset.sample_from_datasets()"):
        return sample_from_datasets(datasets, weights, seed, stop_on_empty_dataset)


def experimental_choose_from_datasets(
    datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = False
) -> Dataset:
    """``tf.data.experimental.choose_from_datasets``: ``Dataset.choose_from_datasets``, but as in
    TensorFlow, ``stop_on_empty_dataset`` defaults to False here (choices of an ended dataset are skipped)."""
    with worded_at("Dataset.choose_from_datasets()"):
        return choose_from_datasets(datasets, choice_dataset, stop_on_empty_dataset)
