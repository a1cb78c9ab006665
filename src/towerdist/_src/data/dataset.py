"""``td.data.Dataset``: a lazily iterated pipeline of numpy elements (a subset of ``tf.data``).

A dataset is a graph of nodes: sources (``from_tensor_slices``, ``range``, files, ...) and
transformations (``batch``, ``map``, ``shuffle``, ...), each a subclass of :class:`Dataset`
implementing a few hooks. Nothing runs until the dataset is iterated; every ``iter()``
starts a new pass (a new *epoch*: ``shuffle`` reshuffles).

The hooks a node implements are described in :mod:`~towerdist._src.data.node`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.iterator import DatasetIterator
from towerdist._src.data.node import Node
from towerdist._src.data.spec import ElementSpec
from towerdist._src.errors import UnimplementedError
from towerdist._src.failures import worded_at
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike

__all__ = ["Dataset"]

_S = TypeVar("_S")  # the state ``reduce`` folds the elements into


class Dataset(Node):
    """A pipeline of elements, each a nested structure (tuple, namedtuple, dict) of arrays.

    Build one from a source and chain transformations; iterate it with ``for``::

        ds = td.data.Dataset.from_tensor_slices((features, labels)).shuffle(1000, seed=0).batch(32)
        for x, y in ds:
            ...

    To run a dataset on several replicas, pass it to
    ``strategy.experimental_distribute_dataset``, which splits each global batch.
    """

    # --- sources ----------------------------------------------------------------------------

    @staticmethod
    def from_tensor_slices(tensors: Nest, name: str | None = None) -> Dataset:
        """One element per row of ``tensors`` (sliced along dimension 0 of every component).

        ``tensors`` is copied, so later changes to it do not show; the elements are read-only
        views of the copy, as TensorFlow's tensors are immutable.

        Example:
          >>> list(td.data.Dataset.from_tensor_slices(([1, 2], [3.0, 4.0])).as_numpy_iterator())
          [(np.int32(1), np.float32(3.0)), (np.int32(2), np.float32(4.0))]
        """
        return sources.TensorSliceDataset(tensors)

    @staticmethod
    def from_tensors(tensors: Nest, name: str | None = None) -> Dataset:
        """A dataset of exactly one element, ``tensors`` (copied; its arrays are read-only)."""
        return sources.TensorDataset(tensors)

    @staticmethod
    def range(*args: int, output_type: DTypeLike = np.int64, name: str | None = None) -> Dataset:
        """``start, start + step, ...`` below ``stop``, like Python's ``range`` (int64 by default)."""
        return sources.RangeDataset(*args, output_type=output_type)

    @staticmethod
    def from_generator(
        generator: Callable[..., Any],
        output_types: Nest = None,
        output_shapes: Nest = None,
        args: tuple[Any, ...] | None = None,
        output_signature: ElementSpec = None,
        name: str | None = None,
    ) -> Dataset:
        """Elements yielded by ``generator(*args)``, called anew for every pass.

        ``output_signature`` (a structure of ``td.TensorSpec``) fixes the structure, dtypes
        and shapes; yielded values are converted to its dtypes and checked against its
        shapes. Without it, the first element fixes the structure, dtypes and ranks, and
        dimension sizes are left unknown. ``output_types``/``output_shapes`` (TensorFlow's
        older spelling) are accepted too.
        """
        return sources.GeneratorDataset(generator, output_types, output_shapes, args, output_signature)

    @staticmethod
    def zip(*args: Nest, datasets: Nest = None, name: str | None = None) -> Dataset:
        """Elements of several datasets side by side: ``zip(a, b)`` or ``zip((a, b))`` or ``zip({"x": a})``.

        Stops at the end of the shortest input.
        """
        return sources.zip_datasets(args, datasets)

    @staticmethod
    def list_files(
        file_pattern: files.FileNames, shuffle: bool | None = None, seed: int | None = None, name: str | None = None
    ) -> Dataset:
        """The file names (``bytes``) matching a glob pattern or a list of patterns.

        Shuffled by default (``shuffle=None``), as in TensorFlow; pass ``shuffle=False`` for
        sorted names. Under multi-worker auto-sharding, a ``TextLineDataset`` reading these
        files is sharded by file.

        Raises:
          InvalidArgumentError: no file matches.
        """
        return files.list_files(file_pattern, shuffle, seed)

    # --- transformations -------------------------------------------------------------------

    @worded_at("batch()")
    def batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Stacks ``batch_size`` consecutive elements into one (the last may be smaller).

        With ``drop_remainder=True`` a last, smaller batch is dropped and the batch
        dimension of ``element_spec`` is static.
        """
        return transforms.BatchDataset(self, batch_size, drop_remainder)

    # --- padding, windows, sampling, grouping and saving -----------------------------------

    @worded_at("Dataset.padded_batch()")
    def padded_batch(
        self,
        batch_size: int,
        padded_shapes: Nest = None,
        padding_values: Nest = None,
        drop_remainder: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Stacks ``batch_size`` consecutive elements, padding each component to a common shape.

        Every dimension is padded at its end, to the size in ``padded_shapes`` or, where that
        is ``None``/-1 (and by default), to the batch's largest size. Padding is zero,
        ``False`` or ``b""`` unless ``padding_values`` (scalars in the elements' structure)
        says otherwise; a padding value must have its component's dtype, and a Python
        ``int`` is an int32 and a ``float`` a float32, as in TensorFlow.

        Example:
          >>> ds = td.data.Dataset.range(1, 4).map(lambda n: np.full(n, n))
          >>> [b.tolist() for b in ds.padded_batch(2)]
          [[[1, 0], [2, 2]], [[3, 3, 3]]]

        Raises:
          InvalidArgumentError: ``batch_size`` < 1.
          ValueError: a padded shape does not fit the component's rank or known sizes, or a
            component of unknown rank has no padded shape.
          TypeError: a padding value's dtype differs from its component's, or a component is
            ragged or sparse (numpy has no such arrays).
          DataLossError: (while iterating) an element is larger than its fixed padded shape.
        """
        return padding.PaddedBatchDataset(self, batch_size, padded_shapes, padding_values, drop_remainder)

    @worded_at("Dataset.window()")
    def window(
        self,
        size: int,
        shift: int | None = None,
        stride: int = 1,
        drop_remainder: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Groups elements into windows, each a small dataset (a tuple/dict of them for structured elements).

        Window ``i`` holds the elements ``i * shift + j * stride`` for ``j < size``
        (``shift`` defaults to ``size``); the last windows may be shorter unless
        ``drop_remainder``. Turn windows back into arrays with ``flat_map``:

        Example:
          >>> ds = td.data.Dataset.range(7).window(3, shift=2, drop_remainder=True)
          >>> [w.tolist() for w in ds.flat_map(lambda w: w.batch(3))]
          [[0, 1, 2], [2, 3, 4], [4, 5, 6]]

        Raises:
          InvalidArgumentError: ``size``, ``shift`` or ``stride`` < 1.
        """
        return windowing.WindowDataset(self, size, shift, stride, drop_remainder)

    @staticmethod
    @worded_at("Dataset.sample_from_datasets()")
    def sample_from_datasets(
        datasets: Sequence[Dataset],
        weights: sampling.Weights | None = None,
        seed: int | None = None,
        stop_on_empty_dataset: bool = False,
        rerandomize_each_iteration: bool | None = None,
    ) -> Dataset:
        """Draws every element from one of ``datasets`` at random, in proportion to ``weights``.

        ``weights`` is a list of floats (one per dataset; uniform by default; datasets of
        weight 0 are left out) or a dataset of such vectors, one per draw (the result ends
        with it). When a drawn dataset has run out, ``stop_on_empty_dataset=True`` ends the
        result; otherwise that dataset is not drawn again. With one dataset, that dataset
        is returned. With a ``seed`` the order is the same on every run and, unless
        ``rerandomize_each_iteration``, on every pass; numpy's random stream makes it
        differ from TensorFlow's for the same seed. The cardinality is infinite when any
        dataset is infinite (even with ``stop_on_empty_dataset``), else unknown.

        Raises:
          ValueError: ``datasets`` is empty, or ``weights`` has another length.
          TypeError: the datasets' structures or dtypes differ, or ``weights`` are not floats.
          InvalidArgumentError: an infinite weight, or (when iterating) a vector of a weights
            dataset without a positive weight.
        """
        return sampling.sample_from_datasets(datasets, weights, seed, stop_on_empty_dataset, rerandomize_each_iteration)

    @staticmethod
    @worded_at("Dataset.choose_from_datasets()")
    def choose_from_datasets(
        datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = True
    ) -> Dataset:
        """Takes every element from ``datasets[i]`` for the next ``i`` of ``choice_dataset`` (int64 scalars).

        When a chosen dataset has run out, ``stop_on_empty_dataset=True`` (the default)
        ends the result; otherwise the choice is skipped.

        Example:
          >>> letters = [td.data.Dataset.from_tensor_slices(list(s)) for s in ("ab", "xy")]
          >>> choice = td.data.Dataset.from_tensor_slices(np.array([0, 1, 1, 0], np.int64))
          >>> list(td.data.Dataset.choose_from_datasets(letters, choice))
          [b'a', b'x', b'y', b'b']

        Raises:
          ValueError: ``datasets`` is empty.
          TypeError: ``choice_dataset`` is not a dataset of int64 scalars, or the datasets'
            structures or dtypes differ.
          InvalidArgumentError: (while iterating) a choice is not an index of ``datasets``.
        """
        return sampling.choose_from_datasets(datasets, choice_dataset, stop_on_empty_dataset)

    @worded_at("Dataset.group_by_window()")
    def group_by_window(
        self,
        key_func: Callable[..., Any],
        reduce_func: Callable[[Any, Dataset], Dataset],
        window_size: int | None = None,
        window_size_func: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Groups elements by an int64 key and reduces each full window with ``reduce_func(key, window)``.

        A key's window is full at ``window_size`` elements (or ``window_size_func(key)``);
        ``reduce_func`` returns a dataset whose elements are the output. Windows still open
        at the end are reduced in ascending key order.

        Example:
          >>> ds = td.data.Dataset.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(2), window_size=2)
          >>> [b.tolist() for b in ds]
          [[0, 3], [1, 4], [2, 5], [6, 9], [7], [8]]

        Raises:
          ValueError: not exactly one of ``window_size`` and ``window_size_func`` given;
            (while iterating) a key or window size that is not an int64 scalar.
          TypeError: (while iterating) ``reduce_func`` does not return a dataset.
        """
        return windowing.GroupByWindowDataset(self, key_func, reduce_func, window_size, window_size_func)

    @worded_at("Dataset.bucket_by_sequence_length()")
    def bucket_by_sequence_length(
        self,
        element_length_func: Callable[..., Any],
        bucket_boundaries: list[int],
        bucket_batch_sizes: list[int],
        padded_shapes: Nest = None,
        padding_values: Nest = None,
        pad_to_bucket_boundary: bool = False,
        no_padding: bool = False,
        drop_remainder: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Batches elements of similar length together, padding each batch (``padded_batch`` rules).

        ``element_length_func`` returns an element's int32 length; bucket ``i`` holds the
        lengths in ``[bucket_boundaries[i-1], bucket_boundaries[i])`` and is batched by
        ``bucket_batch_sizes[i]``. With ``pad_to_bucket_boundary`` the unknown dimensions
        are padded to the bucket's boundary minus one (every length must then be below
        the last boundary); with ``no_padding`` the batches are stacked as they are. Where
        the element spec is known only by running the pipeline (after ``map``), every
        dimension counts as unknown: give ``padded_shapes`` to keep one fixed.

        Raises:
          ValueError: ``len(bucket_batch_sizes) != len(bucket_boundaries) + 1``.
          TypeError: (while iterating) a length that is not int32, as in TensorFlow.
          InternalError: (while iterating) with ``pad_to_bucket_boundary``, a length at or
            beyond the last boundary.
        """
        return windowing.BucketBySequenceLengthDataset(
            self,
            element_length_func,
            bucket_boundaries,
            bucket_batch_sizes,
            padded_shapes,
            padding_values,
            pad_to_bucket_boundary,
            no_padding,
            drop_remainder,
        )

    @worded_at("Dataset.save()")
    def save(
        self,
        path: str,
        compression: str | None = None,
        shard_func: Callable[..., Any] | None = None,
        checkpoint_args: object = None,
    ) -> None:
        """Writes the elements to the directory ``path`` in towerdist's versioned format (no pickle).

        ``compression`` is None or ``"GZIP"``; ``shard_func`` maps an element to an int64
        shard index (one file per shard). The save is atomic: a manifest written last
        commits it, so a failed save leaves an earlier one at ``path`` intact. The format is
        described in docs/input.md and ``towerdist._src.data.persistence``.

        Raises:
          InvalidArgumentError: the dataset is infinite, ``compression`` is unknown, or
            ``shard_func`` returns something other than an int64 scalar.
          TypeError: a component cannot be saved (not numbers, booleans or strings).
          UnimplementedError: ``checkpoint_args`` is given.
        """
        persistence.save(self, path, compression, shard_func, checkpoint_args)

    @staticmethod
    @worded_at("Dataset.load()")
    def load(
        path: str,
        element_spec: ElementSpec = None,
        compression: str | None = None,
        reader_func: Callable[[Dataset], Dataset] | None = None,
        wait: bool = False,
    ) -> Dataset:
        """Reads a dataset written by ``save`` (its element spec and cardinality come from the manifest).

        ``reader_func`` gets a dataset of per-shard datasets and returns the dataset to
        read. By default the shards are interleaved as TensorFlow does
        (``cycle_length`` = the CPU cores, in the order of their indices as unsigned 64-bit
        numbers written with at least 8 digits, compared as text). ``wait`` is accepted for
        compatibility: a towerdist save is complete once it is visible.

        Raises:
          NotFoundError: nothing was saved at ``path``.
          DataLossError: the manifest or a shard file is corrupt, truncated, of an unknown
            format version, or saved with another ``compression`` (while iterating too:
            records are checked as they are read).
          InvalidArgumentError: ``element_spec`` does not match the saved one.
        """
        return persistence.load(path, element_spec, compression, reader_func)

    def unbatch(self, name: str | None = None) -> Dataset:
        """Splits every element along dimension 0 into its rows (the inverse of ``batch``)."""
        return transforms.UnbatchDataset(self)

    @worded_at("rebatch()")
    def rebatch(
        self, batch_size: int | Sequence[int], drop_remainder: bool = False, name: str | None = None
    ) -> Dataset:
        """Re-cuts the rows of the elements into batches of ``batch_size`` (an int or a list of sizes, cycled)."""
        return transforms.RebatchDataset(self, batch_size, drop_remainder)

    def map(
        self,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        synchronous: bool | None = None,
        use_unbounded_threadpool: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Applies ``map_func`` to every element.

        A tuple element is passed as separate arguments (``map_func(x, y)``); any other
        element as one argument. With ``num_parallel_calls`` (or ``td.data.AUTOTUNE``) the
        calls run on a thread pool and results keep their order (also with
        ``deterministic=False``). An exception raised by ``map_func`` comes out of ``next()``
        as it is, with a note naming the element index.

        ``synchronous=True`` runs ``map_func`` in the consumer's thread, one element at a
        time (it cannot be combined with ``num_parallel_calls``, as in TensorFlow).
        ``use_unbounded_threadpool`` is accepted for TensorFlow's signature: towerdist's pool
        has ``num_parallel_calls`` threads either way.

        Raises:
          ValueError: ``synchronous=True`` with ``num_parallel_calls``.
        """
        return mapping.MapDataset(self, map_func, num_parallel_calls, synchronous)

    def filter(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """Keeps the elements for which ``predicate`` returns a scalar ``True``."""
        return mapping.FilterDataset(self, predicate)

    @worded_at("shuffle()")
    def shuffle(
        self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True, name: str | None = None
    ) -> Dataset:
        """Randomly shuffles elements through a buffer of ``buffer_size`` elements (TF's algorithm).

        The buffer holds the next ``buffer_size`` elements; each output is drawn uniformly
        from it and replaced by the next input. With a ``seed`` the order is reproducible
        run to run; ``reshuffle_each_iteration`` gives every pass (epoch) a new order.
        The random stream is numpy's, so the orders differ from TensorFlow's.

        Args:
          buffer_size: how many elements to draw from, at least 1; as in TensorFlow,
            ``td.data.UNKNOWN_CARDINALITY`` (-2) buffers every element.
          seed: makes the order reproducible.
          reshuffle_each_iteration: whether every pass gets a new order.
          name: accepted for compatibility; unused.

        Raises:
          InvalidArgumentError: ``buffer_size`` is 0, or negative other than -2.
        """
        return transforms.ShuffleDataset(self, buffer_size, seed, reshuffle_each_iteration)

    @worded_at("repeat()")
    def repeat(self, count: int | None = None, name: str | None = None) -> Dataset:
        """Repeats the dataset ``count`` times (forever for ``None`` or -1); each repetition is a new pass."""
        return transforms.RepeatDataset(self, count)

    @worded_at("take()")
    def take(self, count: int, name: str | None = None) -> Dataset:
        """The first ``count`` elements (all of them for -1)."""
        return transforms.TakeDataset(self, count)

    @worded_at("skip()")
    def skip(self, count: int, name: str | None = None) -> Dataset:
        """All but the first ``count`` elements (none for -1)."""
        return transforms.SkipDataset(self, count)

    @worded_at("shard()")
    def shard(self, num_shards: int, index: int, name: str | None = None) -> Dataset:
        """Every ``num_shards``-th element, starting at ``index``.

        Raises:
          InvalidArgumentError: ``num_shards`` < 1 or ``index`` outside ``[0, num_shards)``.
        """
        return transforms.ShardDataset(self, num_shards, index)

    @worded_at("prefetch()")
    def prefetch(self, buffer_size: int, name: str | None = None) -> Dataset:
        """Produces up to ``buffer_size`` elements ahead on a background thread.

        The thread stops when the iterator is exhausted, closed, or garbage collected, and
        an exception raised upstream comes out of ``next()``. ``td.data.AUTOTUNE`` picks 2.
        """
        return prefetch.PrefetchDataset(self, buffer_size)

    def cache(self, filename: str = "", name: str | None = None) -> Dataset:
        """Keeps the elements of the first complete pass and replays them on later passes.

        With a ``filename`` the elements are written there (atomically, at the end of a
        complete pass) and later passes, even in other processes, read them back. A pass
        stopped early caches nothing.

        Every pass hands out the cached arrays themselves, read-only (TensorFlow's tensors
        are immutable): an in-place write such as ``x /= 2`` raises numpy's ``ValueError``
        instead of changing later epochs. Compute a new array (``x = x / 2``) instead.

        Raises:
          NotFoundError: (at the first element) the directory of ``filename`` does not exist.
          DataLossError: (at the first element) ``filename`` is not a complete cache file.
        """
        return transforms.CacheDataset(self, filename)

    @worded_at("enumerate()")
    def enumerate(self, start: int = 0, name: str | None = None) -> Dataset:
        """Pairs every element with its int64 position: ``(start + i, element)``.

        As in TensorFlow, the dataset ends before the count would pass the int64 maximum.

        Raises:
          InvalidArgumentError: ``start`` does not fit in int64.
        """
        return transforms.EnumerateDataset(self, start)

    # --- interleaving, combining and folding (interleave.py, combinators.py) ---------------

    @worded_at("Dataset.interleave()")
    def interleave(
        self,
        map_func: Callable[..., Any],
        cycle_length: int | None = None,
        block_length: int | None = None,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Maps every element to a dataset with ``map_func`` and interleaves their elements.

        ``cycle_length`` inputs are open at once; the cycle visits them in turn and each gives
        ``block_length`` consecutive elements per turn. An input that runs out gives up its
        turn, and its slot takes the next input when the cycle comes back to it. A tuple
        element is passed to ``map_func`` as separate arguments.

        Example:
          >>> ds = td.data.Dataset.range(1, 6).interleave(
          ...     lambda x: td.data.Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
          >>> [int(v) for v in ds][:12]
          [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2]

        Args:
          map_func: element -> ``td.data.Dataset``.
          cycle_length: inputs open at once. ``None`` or ``td.data.AUTOTUNE`` follow
            TensorFlow: the number of CPU cores this process may run on
            (``len(os.sched_getaffinity(0))``, else ``os.cpu_count()``); with
            ``num_parallel_calls=k``, ``min(k, cores)``; with ``num_parallel_calls=AUTOTUNE``,
            ``ceil(cores / 3)``.
          block_length: elements an input gives per turn (default 1).
          num_parallel_calls: iterate the open inputs on this many threads (at most
            ``cycle_length``; ``td.data.AUTOTUNE``: ``cycle_length`` threads). The order is
            unchanged unless ``deterministic=False``.
          deterministic: ``False`` lets a parallel interleave hand out elements of whichever
            input is ready first (every element still comes exactly once).
          name: accepted for compatibility; unused.

        Raises:
          InvalidArgumentError: ``cycle_length``/``block_length`` < 1, or ``num_parallel_calls``
            above ``cycle_length`` (other than ``td.data.AUTOTUNE``).
          TypeError: (while iterating) ``map_func`` does not return a dataset.
        """
        return interleave.InterleaveDataset(
            self, map_func, cycle_length, block_length, num_parallel_calls, deterministic
        )

    @worded_at("Dataset.flat_map()")
    def flat_map(self, map_func: Callable[..., Any], name: str | None = None) -> Dataset:
        """Maps every element to a dataset with ``map_func`` and chains those datasets in order.

        A tuple element is passed as separate arguments, a dict as one argument. The length
        is unknown (``len()`` raises ``TypeError``), as in TensorFlow.

        Example:
          >>> [int(v) for v in td.data.Dataset.range(4).flat_map(lambda n: td.data.Dataset.range(n))]
          [0, 0, 1, 0, 1, 2]
        """
        return interleave.FlatMapDataset(self, map_func)

    @worded_at("Dataset.concatenate()")
    def concatenate(self, dataset: Dataset, name: str | None = None) -> Dataset:
        """The elements of this dataset, then those of ``dataset``.

        The element spec keeps what both agree on: a dimension of different sizes becomes
        ``None``, components of different ranks get an unknown shape.

        Raises:
          TypeError: ``dataset`` is not a dataset, or its elements have another structure or dtype.
        """
        return combinators.ConcatenateDataset(self, dataset)

    def apply(self, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
        """``transformation_func(self)``: chains a function that transforms a whole dataset.

        Raises:
          TypeError: ``transformation_func`` does not return a ``td.data.Dataset``.
        """
        return combinators.apply(self, transformation_func)

    def scan(self, initial_state: Nest, scan_func: Callable[[Any, Any], Any], name: str | None = None) -> Dataset:
        """Maps elements with a running state: ``state, output = scan_func(state, element)``.

        Unlike ``map``, a tuple element is passed as ONE argument: ``scan_func(state, (x, y))``.
        The new state must keep the structure and dtypes of ``initial_state`` (Python ints are
        int32, floats float32).

        Example:
          >>> ds = td.data.Dataset.range(5).scan(np.int64(0), lambda total, x: (total + x, total + x))
          >>> [int(v) for v in ds]
          [0, 1, 3, 6, 10]

        Raises:
          TypeError: (while iterating) ``scan_func`` does not return a pair, or changes the
            state's structure or dtypes.
        """
        return combinators.ScanDataset(self, initial_state, scan_func)

    def unique(self, name: str | None = None) -> Dataset:
        """The elements without repeats, each at its first occurrence (int32, int64 or string).

        Raises:
          TypeError: the element has another dtype.
          InvalidArgumentError: the element has more than one component.
        """
        return combinators.UniqueDataset(self)

    def take_while(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """The elements up to (not including) the first for which ``predicate`` is ``False``.

        Raises:
          ValueError: (while iterating) ``predicate`` returns something else than a boolean scalar.
        """
        return combinators.TakeWhileDataset(self, predicate)

    def get_single_element(self, name: str | None = None) -> Nest:
        """The only element of this dataset.

        Raises:
          InvalidArgumentError: the dataset has no element, or more than one.
        """
        return combinators.get_single_element(self)

    def ignore_errors(self, log_warning: bool = False, name: str | None = None) -> Dataset:
        """Drops the elements whose production raised an exception.

        ``map``, ``filter``, ``scan``, ``take_while`` and ``interleave``/``flat_map`` (and the
        datasets their ``map_func`` makes) upstream skip a failing element and go on. An error
        from another operation (a generator, a file reader, ``batch``) ends the pass with a
        ``RuntimeWarning``: Python iterators cannot continue after raising. The cardinality is
        unknown, as in TensorFlow.

        Args:
          log_warning: log every dropped error on the ``towerdist`` logger.
          name: accepted for compatibility; unused.
        """
        return combinators.IgnoreErrorsDataset(self, log_warning)

    @staticmethod
    @worded_at("Dataset.counter()")
    def counter(
        start: sources.Number = 0, step: sources.Number = 1, dtype: DTypeLike = np.int64, name: str | None = None
    ) -> Dataset:
        """``start, start + step, start + 2 * step, ...`` forever, as scalars of ``dtype``.

        Integer counts wrap around at the end of the dtype's range, as in TensorFlow.

        Raises:
          TypeError: ``start`` or ``step`` does not convert exactly to ``dtype``.
        """
        return sources.CounterDataset(start, step, dtype)

    @staticmethod
    def random(
        seed: int | None = None, rerandomize_each_iteration: bool | None = None, name: str | None = None
    ) -> Dataset:
        """Uniformly random int64 values in ``[0, 2**32)``, forever.

        With a ``seed`` the values are reproducible run to run. Every pass repeats the same
        values unless ``rerandomize_each_iteration=True``. The numbers come from numpy's
        generator, so they differ from TensorFlow's for the same seed.
        """
        return sources.RandomDataset(seed, rerandomize_each_iteration)

    def with_options(self, options: options_lib.Options, name: str | None = None) -> Dataset:
        """This dataset with ``options`` merged into its options."""
        return transforms.OptionsDataset(self, options)

    # --- inspecting ------------------------------------------------------------------------

    @property
    def element_spec(self) -> ElementSpec:
        """The structure of ``td.TensorSpec`` of the elements (``None`` dimensions are unknown)."""
        return self._spec(probe=True)

    def cardinality(self) -> np.int64:
        """The number of elements, or ``td.data.INFINITE_CARDINALITY`` / ``UNKNOWN_CARDINALITY``."""
        return np.int64(self._cardinality())

    def options(self) -> options_lib.Options:
        """The options of this dataset (read-only): its inputs', merged in order, then its own.

        As in TensorFlow: ``with_options`` called later wins over earlier calls, and of the
        inputs of ``zip``/``concatenate``/sampling the later ones win (see ``td.data.Options``).
        """
        merged = self._merged_options({})
        merged._set_mutable(False)
        return merged

    def _merged_options(self, done: dict[int, options_lib.Options]) -> options_lib.Options:
        """This node's options; ``done`` holds those of the nodes already merged (a node may be
        the input of several others, as in ``zip((d, d))``)."""
        known = done.get(id(self))
        if known is not None:
            return known
        merged = options_lib.Options()
        for node in self._inputs:
            merged = merged.merge(node._merged_options(done))
        own = getattr(self, "_own_options", None)
        if own is not None:
            merged = merged.merge(own)
        done[id(self)] = merged
        return merged

    def __len__(self) -> int:
        n = self._cardinality()
        if n == options_lib.INFINITE:
            raise TypeError("The dataset is infinite.")
        if n == options_lib.UNKNOWN:
            raise TypeError("The dataset length is unknown.")
        return n

    def __bool__(self) -> bool:
        return True  # a dataset is never falsy, even when empty (as in TensorFlow)

    def __repr__(self) -> str:
        spec = self._spec(probe=False)
        shown = "<unknown until iterated>" if spec is None else repr(spec)
        return f"<{type(self).__name__} element_spec={shown}>"

    # --- iterating -------------------------------------------------------------------------

    def __iter__(self) -> DatasetIterator:
        return DatasetIterator(self)

    def as_numpy_iterator(self) -> DatasetIterator:
        """An iterator of the elements (they already are numpy arrays; strings are ``bytes``)."""
        return DatasetIterator(self)

    def reduce(self, initial_state: _S, reduce_func: Callable[[_S, Nest], _S], name: str | None = None) -> _S:
        """Folds the elements: ``state = reduce_func(state, element)`` from ``initial_state``."""
        state = initial_state
        for element in self:
            state = reduce_func(state, element)
        return state

    def ragged_batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        row_splits_dtype: DTypeLike = np.int64,
        name: str | None = None,
    ) -> Dataset:
        """Refused: TensorFlow's ``ragged_batch`` makes ``tf.RaggedTensor`` batches, which numpy cannot hold.

        Use ``padded_batch`` (pads each batch to its longest element), or ``batch`` after
        making the elements the same shape.

        Raises:
          UnimplementedError: always.
        """
        raise UnimplementedError(
            "Dataset.ragged_batch() makes tf.RaggedTensor batches, which have no numpy equivalent. Use "
            "padded_batch(batch_size) to pad each batch to its longest element, or make the elements the same "
            "shape and use batch()."
        )

    def sparse_batch(self, batch_size: int, row_shape: object, name: str | None = None) -> Dataset:
        """Refused: TensorFlow's ``sparse_batch`` makes ``tf.sparse.SparseTensor`` batches, which numpy cannot hold.

        Use ``padded_batch(batch_size, padded_shapes=row_shape)`` for dense batches padded
        with zeros.

        Raises:
          UnimplementedError: always.
        """
        raise UnimplementedError(
            "Dataset.sparse_batch() makes tf.sparse.SparseTensor batches, which have no numpy equivalent. Use "
            "padded_batch(batch_size, padded_shapes=row_shape) for dense batches padded with zeros."
        )

    def rejection_resample(
        self,
        class_func: Callable[..., Any],
        target_dist: TensorLike,
        initial_dist: TensorLike | None = None,
        seed: int | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Resamples elements at random so that their classes follow ``target_dist``; yields ``(class, element)``.

        ``class_func(element)`` gives each element's class, an int32 or int64 scalar (int16
        too with ``initial_dist``) in ``[0, len(target_dist))``; the class keeps that dtype.
        As in TensorFlow, each output is drawn with probability
        ``m = min_c target_dist[c] / initial_dist[c]`` from the input as it is, and otherwise
        from a rejection-resampled pass over the input, so fewer elements are rejected; an
        element can come out twice, and the output ends when either pass runs out. Without
        ``initial_dist`` the input's class distribution is estimated, once per 32 elements,
        from a third pass. Both distributions are normalized first (TensorFlow uses the
        weights as given). ``seed`` makes a run reproducible (numpy's generator: the elements
        differ from TensorFlow's, their class distribution does not).

        Example:
          >>> ds = td.data.Dataset.from_tensor_slices([0, 0, 0, 1]).repeat(100)
          >>> balanced = ds.rejection_resample(lambda x: x, target_dist=[0.5, 0.5], seed=1)
          >>> next(iter(balanced))  # (class, element)
          (np.int32(0), np.int32(0))

        Raises:
          InvalidArgumentError: a distribution that is not a non-empty vector of non-negative
            weights, distributions of different lengths, or (when iterating) a class outside
            ``[0, len(target_dist))`` or not a scalar.
          TypeError: (when iterating) a class of another dtype.
        """
        return resampling.RejectionResampleDataset(self, class_func, target_dist, initial_dist, seed)


# The operations subclass Dataset, so they are imported once it is defined. The package's
# __init__ imports this module first, so whichever module of the package is imported first,
# Dataset is defined before any operation module runs.
from towerdist._src.data import (  # noqa: E402
    combinators,
    files,
    interleave,
    mapping,
    padding,
    persistence,
    prefetch,
    resampling,
    sampling,
    sources,
    transforms,
    windowing,
)
