"""``Dataset.from_generator``: values that do not fit the signature, and exceptions of the generator.

Expected outputs are TensorFlow 2.21's, observed by iterating the same pipelines there
(each list: the elements, then the error class where ``next`` raised, then END). TF runs the
generator in a ``py_func``, which gives a Python exception the ``tf.errors`` class of its
type: ``ValueError``/``TypeError`` -> ``InvalidArgumentError``, ``MemoryError`` ->
``ResourceExhaustedError``, ``NotImplementedError`` -> ``UnimplementedError``, anything else
-> ``UnknownError``; towerdist keeps the original as the error's ``__cause__``.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import D

S = td.TensorSpec
END = "END"


def _outcome(dataset, limit=10):
    """The elements (as lists), an error's class name where ``next`` raised, then END."""
    out = []
    iterator = iter(dataset)
    for _ in range(limit):
        try:
            element = next(iterator)
        except StopIteration:
            out.append(END)
            break
        except Exception as error:
            out.append(type(error).__name__)
        else:
            out.append(np.asarray(element).tolist())
    return out


def _yielding(*values):
    def gen():
        yield from values

    return gen


def _raising(error, count=2):
    def gen():
        yield from range(count)
        raise error

    return gen


# --- values that do not fit output_signature --------------------------------------------------------

# (name, values yielded, signature, TF 2.21's outcome, towerdist's where the pass then ends)
MISFITS = [
    ("str_into_int64", ([1, "a", 3]), S((), td.int64), [1, "InvalidArgumentError", 3, END]),
    ("none_into_int64", ([1, None, 2]), S((), td.int64), [1, "InvalidArgumentError", 2, END]),
    ("vector_into_scalar", ([1, [1, 2], 3]), S((), td.int64), [1, "InvalidArgumentError", 3, END]),
    (
        "length_3_into_2",
        ([[1, 2], [1, 2, 3], [3, 4]]),
        S((2,), td.int64),
        [[1, 2], "InvalidArgumentError", [3, 4], END],
    ),
    ("rank_2_into_1", ([[1, 2], [[1, 2]]]), S((None,), td.int64), [[1, 2], "InvalidArgumentError", END]),
]


@pytest.mark.parametrize("values, signature, tf_outcome", [m[1:] for m in MISFITS], ids=[m[0] for m in MISFITS])
def test_a_value_that_does_not_fit_the_signature_is_invalid_argument(values, signature, tf_outcome):
    outcome = _outcome(D.from_generator(_yielding(*values), output_signature=signature))
    # Decided difference (docs/concepts.md): TF goes on with the generator after the error; the
    # pass ends here, as after any error of a towerdist pipeline.
    error_at = tf_outcome.index("InvalidArgumentError")
    assert outcome == [*tf_outcome[: error_at + 1], END]


@pytest.mark.parametrize("values, signature, tf_outcome", [m[1:] for m in MISFITS], ids=[m[0] for m in MISFITS])
def test_ignore_errors_drops_a_value_that_does_not_fit_and_goes_on(values, signature, tf_outcome):
    outcome = _outcome(D.from_generator(_yielding(*values), output_signature=signature).ignore_errors())
    assert outcome == [x for x in tf_outcome if x != "InvalidArgumentError"]  # TF 2.21


def test_the_messages_are_tensorflows():
    def first_error(values, signature):
        with pytest.raises(td.errors.InvalidArgumentError) as info:
            list(D.from_generator(_yielding(*values), output_signature=signature))
        return str(info.value)

    # TF 2.21: "TypeError: `generator` yielded an element that could not be converted to the expected
    # type. The expected type was int64, but the yielded element was a."
    assert first_error(["a"], S((), td.int64)).startswith(
        "TypeError: `generator` yielded an element that could not be converted to the expected type. The "
        "expected type was int64, but element 0 was 'a'."
    )
    # TF 2.21: "TypeError: `generator` yielded an element of shape (2,) where an element of shape () was expected."
    assert first_error([[1, 2]], S((), td.int64)).startswith(
        "TypeError: `generator` yielded an element of shape (2,) where an element of shape () was expected"
    )
    # TF 2.21: "TypeError: `generator` yielded an element that did not match the expected structure. ..."
    assert first_error([3], (S((), td.int64), S((), td.int64))).startswith(
        "TypeError: `generator` yielded an element that did not match the expected structure."
    )


# TF 2.21: values numpy converts are converted, as TF does.
CONVERTED = [
    ("float_into_int64", [1, 2.5, 3], S((), td.int64), [1, 2, 3]),
    ("int_into_float32", [1, 2], S((), td.float32), [1.0, 2.0]),
    ("bool_into_int64", [True], S((), td.int64), [1]),
    ("unknown_length", [[1, 2], [1, 2, 3]], S((None,), td.int64), [[1, 2], [1, 2, 3]]),
]


@pytest.mark.parametrize("values, signature, expected", [c[1:] for c in CONVERTED], ids=[c[0] for c in CONVERTED])
def test_values_that_convert_are_converted(values, signature, expected):
    assert _outcome(D.from_generator(_yielding(*values), output_signature=signature)) == [*expected, END]


# --- exceptions raised by the generator ----------------------------------------------------------------

RAISED = [
    ("value_error", ValueError("corrupt record 2"), td.errors.InvalidArgumentError, "ValueError: corrupt record 2"),
    ("type_error", TypeError("bad"), td.errors.InvalidArgumentError, "TypeError: bad"),
    ("unicode_error", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), td.errors.InvalidArgumentError, "Unicode"),
    ("key_error", KeyError("k"), td.errors.UnknownError, "KeyError: 'k'"),
    ("runtime_error", RuntimeError("r"), td.errors.UnknownError, "RuntimeError: r"),
    ("os_error", OSError("disk"), td.errors.UnknownError, "OSError: disk"),
    ("not_implemented", NotImplementedError("n"), td.errors.UnimplementedError, "NotImplementedError: n"),
    ("memory_error", MemoryError("m"), td.errors.ResourceExhaustedError, "MemoryError: m"),
    ("op_error", td.errors.OutOfRangeError("oor"), td.errors.UnknownError, "OutOfRangeError: oor"),
]


@pytest.mark.parametrize("error, cls, start", [r[1:] for r in RAISED], ids=[r[0] for r in RAISED])
def test_an_exception_of_the_generator_is_tensorflows_class_with_the_original_as_cause(error, cls, start):
    iterator = iter(D.from_generator(_raising(error), output_signature=S((), td.int64)))
    assert [int(next(iterator)), int(next(iterator))] == [0, 1]
    with pytest.raises(cls) as info:
        next(iterator)
    assert type(info.value) is cls
    assert str(info.value).startswith(start)
    assert "by the generator, after 2 elements" in str(info.value)
    assert info.value.__cause__ is error
    assert list(iterator) == []  # TF 2.21: [0, 1, error, END]: the generator has ended


def test_raise_stop_iteration_in_a_generator_is_unknown():
    # PEP 479 makes it a RuntimeError. TF 2.21: [0, UnknownError, END].
    def gen():
        yield 0
        raise StopIteration

    assert _outcome(D.from_generator(gen, output_signature=S((), td.int64))) == [0, "UnknownError", END]


def test_a_callable_that_returns_no_iterator_is_invalid_argument():
    # TF 2.21: InvalidArgumentError("TypeError: 'int' object is not iterable ...").
    ds = D.from_generator(lambda: 3, output_signature=S((), td.int64))
    with pytest.raises(td.errors.InvalidArgumentError, match="^TypeError: 'int' object is not iterable") as info:
        list(ds)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize(
    "transform, expected",
    [
        (lambda d: d, [0, 1, "InvalidArgumentError", END]),
        (lambda d: d.map(lambda x: x + 1), [1, 2, "InvalidArgumentError", END]),
        (lambda d: d.batch(2), [[0, 1], "InvalidArgumentError", END]),
        (lambda d: d.ignore_errors(), [0, 1, END]),
    ],
    ids=["plain", "map", "batch", "ignore_errors"],
)
def test_downstream_of_a_failing_generator(transform, expected):
    ds = D.from_generator(_raising(ValueError("corrupt record 2")), output_signature=S((), td.int64))
    assert _outcome(transform(ds)) == expected  # TF 2.21


def test_a_saved_position_keeps_the_class_and_message_of_a_generator_error():
    # A prefetch thread that buffered the error saves it with the position (saved_errors).
    from towerdist._src.data import saved_errors

    iterator = iter(D.from_generator(_raising(KeyError("k")), output_signature=S((), td.int64)))
    with pytest.raises(td.errors.UnknownError) as info:
        list(iterator)
    restored = saved_errors.restore_error(saved_errors.save_error(info.value))
    assert type(restored) is td.errors.UnknownError
    assert str(restored) == str(info.value)
