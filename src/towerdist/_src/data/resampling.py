"""``rejection_resample``: resamples elements so that their classes follow a target distribution.

``class_func(element)`` gives an element's class, an integer in ``[0, len(target_dist))``;
``p`` is the input's class distribution (``initial_dist``, or an estimate) and ``t`` the
target. TensorFlow's scheme, which rejects as few elements as it can, is followed:

* Each output element is drawn, with probability ``m = min_c t_c / p_c``, from the
  *original* stream (every input element, in order), and otherwise from the *filtered*
  stream (the input elements, in order, each kept with probability
  ``a_c = (t_c / p_c - m) / (max_k t_k / p_k - m)``). The mixture is distributed as ``t``.
  The two streams are two passes over the input, so an element can be output twice (once
  from each), and the output ends as soon as the stream drawn from is exhausted: from 200
  elements of classes 75% / 25% with a balanced target, about 150 elements come out
  (``m = 2/3``; the filtered stream keeps only the 50 of the rare class).
* ``m == 1`` (the input already follows the target) outputs every element once; ``m == 0``
  (a class present in the input has target 0) outputs the filtered stream only, a plain
  rejection resampling.
* Without ``initial_dist``, ``p`` is estimated from a third pass over the classes, as
  TensorFlow does: counts that start at 10 for every class, updated once per 32 elements
  (including those 32), give the estimate for those 32 elements and for those 32 output
  draws. The output then ends after at most ``32 * ceil(n / 32)`` elements for an input of
  ``n``.

The output elements are ``(class, element)`` pairs, the class with ``class_func``'s dtype:
int32 or int64, or int16 when ``initial_dist`` is given (TensorFlow refuses other dtypes
with a ``TypeError``). Two differences from TensorFlow: the random draws are numpy's
(``seed`` makes a run reproducible, and every pass the same; without it each pass draws
anew, and a saved iterator carries what a restored one needs to draw as it would have; which
elements come out differs from TensorFlow's run with the same seed), and both distributions
are normalized to sum to 1 first, where TensorFlow uses the weights as given (weights such
as ``[1, 1]`` then miss the target there).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import Cursor, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.seeds import Seeded
from towerdist._src.data.spec import ElementSpec, TensorSpec
from towerdist._src.data.structure import call_with_element, sample_element
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import Nest, TensorLike

__all__ = ["RejectionResampleDataset", "experimental_rejection_resample"]

_API = "Dataset.rejection_resample()"
_END = object()


def _distribution(value: TensorLike, name: str) -> np.ndarray:
    """``value`` as a 1-D float64 vector of non-negative, finite weights with a positive sum."""
    try:
        dist = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{_API} takes {name} as a vector of class probabilities. Got {name}={value!r}.") from None
    if dist.ndim != 1 or dist.size == 0:
        raise InvalidArgumentError(
            f"{_API} takes {name} as a non-empty vector (one probability per class). Got shape {dist.shape}."
        )
    if not np.all(np.isfinite(dist)) or np.any(dist < 0) or dist.sum() <= 0:
        raise InvalidArgumentError(
            f"{_API} takes {name} as non-negative, finite probabilities with a positive sum. Got {name}={value!r}."
        )
    normalized: np.ndarray = dist / dist.sum()
    return normalized


# TensorFlow's estimate of the input's class distribution when no initial_dist is given:
# counts that start at _ESTIMATE_PRIOR for every class, updated once per _ESTIMATE_BATCH elements.
_ESTIMATE_BATCH = 32
_ESTIMATE_PRIOR = 10

# class_func's dtypes that TensorFlow accepts (it gathers acceptance probabilities with the
# class; its estimate of the distribution, a one-hot, does not take int16).
_CLASS_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_CLASS_DTYPES_GIVEN_INITIAL = (*_CLASS_DTYPES, np.dtype(np.int16))


def _estimate_start(classes: int) -> dict[str, Any]:
    """The position of an estimate of the class distribution before its first element (see ``_estimated``)."""
    return {"counts": [_ESTIMATE_PRIOR] * classes, "read": 0, "left": 0, "value": None}


def _mixing(target: np.ndarray, initial: np.ndarray) -> tuple[np.ndarray, float]:
    """The filtered stream's acceptance probability per class, and the probability ``m`` of the original stream.

    Both distributions sum to 1. A class the input lacks but the target wants has an infinite
    ratio: the filtered stream then accepts that class only (never met), as TensorFlow's
    formula does in the limit.
    """
    absent = initial <= 0
    ratio = np.where(absent, np.where(target > 0, np.inf, 0.0), target / np.where(absent, 1.0, initial))
    low, high = float(ratio.min()), float(ratio.max())
    if np.isinf(high):
        acceptance = np.isinf(ratio).astype(np.float64)
    elif high > low:
        acceptance = (ratio - low) / (high - low)
    else:
        acceptance = np.zeros_like(ratio)
    return acceptance, min(max(low, 0.0), 1.0)


class RejectionResampleDataset(Seeded, Dataset):
    """``rejection_resample``: see the module docstring."""

    def __init__(
        self,
        input_dataset: Dataset,
        class_func: Callable[..., Any],
        target_dist: TensorLike,
        initial_dist: TensorLike | None,
        seed: int | None,
    ) -> None:
        if not callable(class_func):
            raise TypeError(f"{_API} takes a callable class_func. Got class_func={class_func!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"{_API} takes an integer seed or None. Got seed={seed!r}.")
        self._inputs = (input_dataset,)
        self._class_func = class_func
        self._target = _distribution(target_dist, "target_dist")
        self._initial = None if initial_dist is None else _distribution(initial_dist, "initial_dist")
        if self._initial is not None and self._initial.shape != self._target.shape:
            raise InvalidArgumentError(
                f"{_API} needs initial_dist and target_dist of the same length (one entry per class). Got "
                f"{self._initial.size} and {self._target.size}."
            )
        self._init_seed(None if seed is None else int(seed))

    def _class_of(self, element: Nest, index: int) -> tuple[int, Any]:
        """``element``'s class as an int and as the scalar ``class_func`` returned (its dtype kept)."""
        try:
            value = np.asarray(call_with_element(self._class_func, element))
        except Exception as error:
            error.add_note(f"{_API}: raised by class_func on element {index}.")
            raise
        allowed = _CLASS_DTYPES if self._initial is None else _CLASS_DTYPES_GIVEN_INITIAL
        if value.dtype not in allowed:
            names = "int32 or int64" if self._initial is None else "int16, int32 or int64"
            raise TypeError(
                f"{_API}: class_func must return an {names} class (as TensorFlow requires"
                f"{'' if self._initial is not None else '; int16 only with initial_dist'}), but it returned "
                f"{value.dtype} for element {index}. Cast it, e.g. with np.int32(...)."
            )
        if value.shape != ():
            raise InvalidArgumentError(
                f"{_API}: class_func must return an integer scalar; it returned {value.dtype} of shape "
                f"{value.shape} for element {index}."
            )
        label = int(value)
        if not 0 <= label < self._target.size:
            raise InvalidArgumentError(
                f"{_API}: class_func returned class {label} for element {index}, outside [0, {self._target.size}) "
                f"(target_dist has {self._target.size} classes)."
            )
        return label, value[()]

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the two random generators (``choose_rng`` picks the stream of each
        # output, ``accept_rng`` keeps or rejects the filtered stream's elements), the elements
        # each stream has read (``original``, ``filtered``; for messages), the passes over the
        # input (children "original", "filtered") and, without initial_dist, the two estimates
        # of the class distribution (``shares`` and ``accepts``, see _estimated) with their
        # passes over the input. The generators are drawn now, as the pass is created (see cursor).
        if not state.resumed:
            if self._seeds.seeded:
                sequence = np.random.SeedSequence(self._seed)  # every pass the same, as in TensorFlow
            else:
                sequence = np.random.SeedSequence([self._seed, self._seeds.next_epoch()])
            state.choose_rng, state.accept_rng = (np.random.default_rng(s) for s in sequence.spawn(2))
            state.original, state.filtered = 0, 0
            if self._initial is None:
                state.shares, state.accepts = _estimate_start(self._target.size), _estimate_start(self._target.size)
        return self._resampled(state)

    def _resampled(self, state: State) -> Iterator[Any]:
        estimating = self._initial is None
        acceptance: np.ndarray | None = None
        share = 0.0  # (estimated per draw when estimating)
        keys: tuple[str, ...] = ("original", "filtered", "shares", "accepts")
        if self._initial is not None:
            acceptance, share = _mixing(self._target, self._initial)
            if share >= 1.0 - 1e-9:  # the input already follows the target: every element once
                share, keys = 1.0, ("original",)
            elif share <= 0.0:  # a plain rejection resampling
                keys = ("filtered",)
            else:
                keys = ("original", "filtered")
        passes = {key: state.open(self._inputs[0], key) for key in keys}
        choose_rng: np.random.Generator = state.choose_rng
        try:
            while True:
                if estimating:
                    estimated = self._estimated(state.shares, passes["shares"], 1)
                    if estimated is None:
                        return
                    share = estimated
                if share >= 1.0 or (share > 0.0 and choose_rng.random() < share):
                    item = self._next_original(state, passes["original"])
                else:
                    item = self._next_filtered(state, passes, acceptance)
                if item is None:  # TensorFlow stops as soon as the stream drawn from is exhausted
                    return
                yield item
        finally:
            for source in passes.values():
                source.close()

    def _restored_input(self, key: str, state: State) -> Dataset:
        return self._inputs[0]  # every pass ("original", "filtered", "shares", "accepts") is over the input

    def _state_params(self) -> dict[str, Any]:
        return {"classes": int(self._target.size), "initial_dist": self._initial is not None}

    def _next_original(self, state: State, source: Cursor) -> tuple[Any, Any] | None:
        """The original stream's next ``(class, element)``: every input element, in order."""
        element = next(source, _END)
        if element is _END:
            return None
        index = state.original
        state.original = index + 1
        return self._class_of(element, index)[1], element

    def _next_filtered(
        self, state: State, passes: dict[str, Cursor], acceptance: np.ndarray | None
    ) -> tuple[Any, Any] | None:
        """The filtered stream's next ``(class, element)``: the next input element kept with its class's
        probability in ``acceptance``, or (None: estimating) in the estimate for the element's position."""
        source, rng = passes["filtered"], state.accept_rng
        while True:
            element = next(source, _END)
            if element is _END:
                return None
            accepted = acceptance
            if accepted is None:
                accepted = self._estimated(state.accepts, passes["accepts"], 0)
                if accepted is None:
                    return None
            index = state.filtered
            state.filtered = index + 1
            label, value = self._class_of(element, index)
            if rng.random() < accepted[label]:
                return value, element

    def _estimated(self, estimate: dict[str, Any], source: Cursor, part: int) -> Any:
        """Part ``part`` of ``_mixing`` (0: the acceptances, 1: the share) under the estimated class
        distribution for the next position, or None at the end of the input.

        ``estimate`` is the position of one estimate: ``counts``, the class counts (starting
        at ``_ESTIMATE_PRIOR``) of the elements its pass over the input (``source``) has read,
        ``read``; ``value``, what the current estimate gives, for ``left`` more positions. The
        estimate is updated once per ``_ESTIMATE_BATCH`` elements and serves those elements'
        positions, a short last batch too (so the output can run up to a multiple of the batch
        size past the input's length).
        """
        if not estimate["left"]:
            batch = list(itertools.islice(source, _ESTIMATE_BATCH))
            if not batch:
                return None
            counts, read = estimate["counts"], estimate["read"]
            for offset, element in enumerate(batch):
                counts[self._class_of(element, read + offset)[0]] += 1
            distribution = np.asarray(counts, dtype=np.float64) / sum(counts)
            estimate["read"], estimate["left"] = read + len(batch), _ESTIMATE_BATCH
            estimate["value"] = _mixing(self._target, distribution)[part]
        estimate["left"] -= 1
        return estimate["value"]

    def _spec(self, probe: bool) -> ElementSpec:
        if not probe:
            return None
        inner = self._inputs[0]._spec(probe)
        if inner is None:
            return None
        _, value = self._class_of(sample_element(self._inputs[0], "rejection_resample"), 0)
        return (TensorSpec((), value.dtype), inner)

    def _cardinality(self) -> int:
        # TensorFlow's: the resampled stream of an infinite input stays infinite, any other is UNKNOWN.
        if self._inputs[0]._cardinality() == options_lib.INFINITE:
            return options_lib.INFINITE
        return options_lib.UNKNOWN


def experimental_rejection_resample(
    class_func: Callable[..., Any],
    target_dist: TensorLike,
    initial_dist: TensorLike | None = None,
    seed: int | None = None,
) -> Callable[[Dataset], Dataset]:
    """``td.data.experimental.rejection_resample``: ``Dataset.rejection_resample`` for ``apply``."""
    return lambda dataset: dataset.rejection_resample(class_func, target_dist, initial_dist, seed)
