"""Unit tests of tensor packing (``towerdist._src.cross_device_ops.packing``).

Packing is pure bookkeeping, so these tests call the helpers directly with the numpy
backend. Expected values come from TensorFlow's rules (reference sections 4.3 and 4.7).
"""

from __future__ import annotations

import numpy as np
import pytest

from towerdist._src.backend import numpy_backend
from towerdist._src.cross_device_ops import packing

# --- split_ranges (num_packs) ---------------------------------------------------------------


def test_split_ranges_matches_tensorflow_example():
    # Reference 4.3: T=11 elements in 3 packs -> sizes [3, 3, 5].
    assert packing.split_ranges(11, 3) == [(0, 3), (3, 6), (6, 11)]


@pytest.mark.parametrize(("total", "num_packs"), [(10, 1), (10, 2), (10, 3), (12, 4), (13, 4), (100, 7), (5, 5)])
def test_split_ranges_gives_equal_packs_and_the_remainder_to_the_last(total, num_packs):
    ranges = packing.split_ranges(total, num_packs)
    split = total // num_packs
    expected_sizes = [split] * (num_packs - 1) + [total - split * (num_packs - 1)]
    assert [stop - start for start, stop in ranges] == expected_sizes
    # The ranges are consecutive and cover range(total) exactly.
    assert ranges[0][0] == 0
    assert ranges[-1][1] == total
    assert all(prev[1] == nxt[0] for prev, nxt in zip(ranges, ranges[1:]))


@pytest.mark.parametrize(("total", "num_packs", "expected"), [(2, 3, [(0, 2)]), (0, 2, []), (1, 1, [(0, 1)])])
def test_split_ranges_drops_empty_ranges(total, num_packs, expected):
    """With fewer elements than packs only non-empty ranges remain (documented in the docstring)."""
    assert packing.split_ranges(total, num_packs) == expected


@pytest.mark.parametrize("num_packs", [0, -1, -5])
def test_split_ranges_rejects_non_positive_num_packs(num_packs):
    with pytest.raises(ValueError, match="num_packs must be greater than zero"):
        packing.split_ranges(10, num_packs)


# --- group_by_size (CommunicationOptions.bytes_per_pack) ------------------------------------


def test_group_by_size_matches_tensorflow_example():
    # Reference 4.7: float32 tensors of 40, 1200, 20, 4000, 8 bytes with bytes_per_pack=1024
    # -> packs [[10],[300]], [[5],[1000]], [[2]] (a pack closes once it holds > 1024 bytes).
    nbytes = [np.dtype(np.float32).itemsize * n for n in (10, 300, 5, 1000, 2)]
    assert nbytes == [40, 1200, 20, 4000, 8]
    assert packing.group_by_size(nbytes, 1024) == [[0, 1], [2, 3], [4]]


def test_group_by_size_zero_puts_everything_in_one_group():
    assert packing.group_by_size([40, 1200, 20, 4000, 8], 0) == [[0, 1, 2, 3, 4]]


def test_group_by_size_of_nothing_is_no_groups():
    assert packing.group_by_size([], 1024) == []


def test_group_by_size_tiny_threshold_gives_one_group_per_value():
    assert packing.group_by_size([4, 8, 16], 1) == [[0], [1], [2]]


def test_group_by_size_huge_threshold_gives_one_group():
    assert packing.group_by_size([4, 8, 16], 1 << 30) == [[0, 1, 2]]


def test_group_by_size_closes_a_group_only_when_it_exceeds_the_threshold():
    # 512 + 512 == 1024 is not *more* than 1024, so the third value joins the same group.
    assert packing.group_by_size([512, 512, 4, 2000, 1], 1024) == [[0, 1, 2], [3], [4]]


# --- group_by_dtype -------------------------------------------------------------------------


def test_group_by_dtype_keeps_first_appearance_order():
    dtypes = [np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)]
    assert packing.group_by_dtype(dtypes) == [[0, 2], [1, 4], [3]]


def test_group_by_dtype_groups_any_hashable_key():
    keys = [("a", np.float32), ("b", np.float32), ("a", np.float32), ("a", np.int64)]
    assert packing.group_by_dtype(keys) == [[0, 2], [1], [3]]


def test_group_by_dtype_of_nothing_is_no_groups():
    assert packing.group_by_dtype([]) == []


# --- pack / unpack --------------------------------------------------------------------------

SHAPE_LISTS = [
    [(3,)],
    [(2, 3), (4,), ()],
    [(0,), (2, 2), (0, 3), (1,)],
    [(3, 1, 2), (), (), (5,)],
]


def _arrays(shapes, dtype):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape) * 100).astype(dtype) for shape in shapes]


@pytest.mark.parametrize("shapes", SHAPE_LISTS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_pack_concatenates_flattened_arrays_in_order(shapes, dtype):
    arrays = _arrays(shapes, dtype)
    buffer = packing.pack(numpy_backend, arrays)
    assert buffer.ndim == 1
    assert buffer.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(buffer, np.concatenate([a.ravel() for a in arrays]))


@pytest.mark.parametrize("shapes", SHAPE_LISTS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_unpack_inverts_pack(shapes, dtype):
    arrays = _arrays(shapes, dtype)
    restored = packing.unpack(numpy_backend, packing.pack(numpy_backend, arrays), shapes)
    assert len(restored) == len(arrays)
    for original, back in zip(arrays, restored):
        assert back.shape == original.shape
        assert back.dtype == original.dtype
        np.testing.assert_array_equal(back, original)


def test_pack_accepts_non_contiguous_arrays():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    arrays = [base.T, base[:, ::2], base[1]]
    restored = packing.unpack(numpy_backend, packing.pack(numpy_backend, arrays), [a.shape for a in arrays])
    for original, back in zip(arrays, restored):
        np.testing.assert_array_equal(back, original)


def test_unpack_returns_views_of_the_buffer():
    """Unpacking must not copy: the pieces look at the reduced pack (docstring: "Views")."""
    buffer = np.arange(10, dtype=np.float32)
    pieces = packing.unpack(numpy_backend, buffer, [(2, 2), (), (5,)])
    assert all(np.shares_memory(piece, buffer) for piece in pieces)
    np.testing.assert_array_equal(pieces[1], np.float32(4))
