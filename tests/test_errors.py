"""``td.errors``: TensorFlow's error classes, hierarchy, codes and constructors.

The expected values are literals observed in TensorFlow 2.21 (``dir(tf.errors)``, each
class's ``__mro__`` and ``error_code``, ``str(e)`` and ``e.message``); TensorFlow is not
imported here.
"""

from __future__ import annotations

import copy
import pickle
import traceback
import warnings

import pytest

import towerdist as td
from towerdist._src import config as config_lib
from towerdist._src import profiler as profiler_lib

# Observed in TensorFlow 2.21: every OpError subclass in tf.errors with its error_code;
# each class's __mro__ is (cls, OpError, Exception, BaseException, object).
TF_CLASSES = {
    "CancelledError": 1,
    "UnknownError": 2,
    "InvalidArgumentError": 3,
    "DeadlineExceededError": 4,
    "NotFoundError": 5,
    "AlreadyExistsError": 6,
    "PermissionDeniedError": 7,
    "ResourceExhaustedError": 8,
    "FailedPreconditionError": 9,
    "AbortedError": 10,
    "OutOfRangeError": 11,
    "UnimplementedError": 12,
    "InternalError": 13,
    "UnavailableError": 14,
    "DataLossError": 15,
    "UnauthenticatedError": 16,
}

# Observed in TensorFlow 2.21: the error-code constants of tf.errors.
TF_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}

# Observed in TensorFlow 2.21: the public names of tf.errors.
TF_NAMES = sorted([*TF_CLASSES, *TF_CODES, "OpError", "OperatorNotAllowedInGraphError"])

# The builtin each class also is in towerdist (TensorFlow's OpErrors subclass no builtin):
# the builtins towerdist raised in those places before it had the TensorFlow class.
BUILTINS = {
    "InvalidArgumentError": ValueError,
    "DeadlineExceededError": TimeoutError,
    "UnimplementedError": NotImplementedError,
}


@pytest.mark.parametrize("name", TF_NAMES)
def test_every_tensorflow_name_is_in_td_errors(name):
    assert name in td.errors.__all__
    assert hasattr(td.errors, name)


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_each_class_derives_from_op_error_as_in_tensorflow(name):
    cls = getattr(td.errors, name)
    assert issubclass(cls, td.errors.OpError)
    assert cls.__mro__[1] is td.errors.OpError
    others = [c for c in TF_CLASSES if c != name]
    assert not any(issubclass(cls, getattr(td.errors, other)) for other in others)


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_each_class_has_tensorflows_error_code(name):
    cls = getattr(td.errors, name)
    assert cls(None, None, "m").error_code == TF_CLASSES[name]
    assert cls("m").error_code == TF_CLASSES[name]


@pytest.mark.parametrize("name", sorted(TF_CODES))
def test_error_code_constants_have_tensorflows_values(name):
    assert getattr(td.errors, name) == TF_CODES[name]


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_builtin_relations(name):
    cls = getattr(td.errors, name)
    wanted = BUILTINS.get(name)
    for builtin in (ValueError, TimeoutError, NotImplementedError, TypeError, RuntimeError, LookupError):
        expected = wanted is not None and issubclass(wanted, builtin)  # NotImplementedError is a RuntimeError
        assert issubclass(cls, builtin) == expected, (name, builtin)


def test_operator_not_allowed_in_graph_error_is_a_type_error():
    # Observed in TensorFlow 2.21: its MRO is (cls, TypeError, Exception, BaseException, object).
    assert td.errors.OperatorNotAllowedInGraphError.__mro__[1] is TypeError
    assert not issubclass(td.errors.OperatorNotAllowedInGraphError, td.errors.OpError)


def test_tensorflow_constructor_form():
    # Observed in TensorFlow 2.21: OutOfRangeError(None, None, "End of sequence") has
    # str() == message == "End of sequence", error_code 11, op and node_def None, payloads {}.
    error = td.errors.OutOfRangeError(None, None, "End of sequence")
    assert str(error) == error.message == "End of sequence"
    assert error.error_code == 11
    assert error.op is None and error.node_def is None
    assert error.experimental_payloads == {}


def test_op_error_takes_the_error_code_as_fourth_argument():
    # Observed in TensorFlow 2.21: OpError(None, None, "msg", tf.errors.INTERNAL).error_code == 13.
    error = td.errors.OpError(None, None, "msg", td.errors.INTERNAL)
    assert (str(error), error.error_code) == ("msg", 13)
    assert type(error) is td.errors.OpError


def test_keyword_constructor_form():
    # Observed in TensorFlow 2.21: OutOfRangeError(node_def=None, op=None, message="kw") works.
    error = td.errors.OutOfRangeError(node_def=None, op=None, message="kw")
    assert str(error) == "kw"


def test_a_fourth_argument_of_a_subclass_is_the_payloads():
    # Observed in TensorFlow 2.21: OutOfRangeError(None, None, "m", {"a": b"b"}).experimental_payloads.
    error = td.errors.OutOfRangeError(None, None, "m", {"a": b"b"})
    assert error.experimental_payloads == {"a": b"b"}
    assert error.error_code == td.errors.OUT_OF_RANGE


def test_node_def_and_op_are_kept():
    error = td.errors.NotFoundError("node", "op", "gone")
    assert (error.node_def, error.op, error.message) == ("node", "op", "gone")


def test_towerdist_constructor_form_sets_details_as_attributes():
    error = td.errors.DeadlineExceededError("replica 1 did not arrive", missing=[1])
    assert str(error) == error.message == "replica 1 did not arrive"
    assert error.missing == [1]
    assert error.error_code == td.errors.DEADLINE_EXCEEDED
    assert error.op is None and error.node_def is None


def test_op_error_in_towerdist_form_has_code_unknown():
    assert td.errors.OpError("m").error_code == td.errors.UNKNOWN


def test_args_hold_the_message():
    # towerdist keeps the message in args (TensorFlow 2.21's args are ()), so repr shows it.
    error = td.errors.AbortedError(None, None, "worker 1 failed")
    assert error.args == ("worker 1 failed",)
    assert repr(error) == "AbortedError('worker 1 failed')"


@pytest.mark.parametrize("attribute", ["message", "op", "node_def", "error_code", "experimental_payloads"])
def test_attributes_are_read_only_as_in_tensorflow(attribute):
    # Observed in TensorFlow 2.21: each is a property without a setter (AttributeError).
    error = td.errors.InternalError(None, None, "m")
    with pytest.raises(AttributeError):
        setattr(error, attribute, "other")


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_pickle_keeps_class_message_code_and_details(name):
    # Observed in TensorFlow 2.21: pickle and copy keep the class, message and error_code.
    error = getattr(td.errors, name)(None, None, "lost", path="/tmp/x")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert (clone.message, clone.error_code, clone.path) == ("lost", TF_CLASSES[name], "/tmp/x")


def test_pickle_of_op_error_keeps_its_code():
    clone = pickle.loads(pickle.dumps(td.errors.OpError(None, None, "msg", td.errors.INTERNAL)))
    assert (type(clone), clone.message, clone.error_code) == (td.errors.OpError, "msg", 13)


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copy_keeps_message_and_code(copier):
    clone = copier(td.errors.DataLossError("bad file", path="f"))
    assert (type(clone), clone.message, clone.error_code, clone.path) == (td.errors.DataLossError, "bad file", 15, "f")


def test_errors_are_caught_by_op_error_and_their_builtin():
    with pytest.raises(td.errors.OpError):
        raise td.errors.InvalidArgumentError("x")
    with pytest.raises(ValueError):
        raise td.errors.InvalidArgumentError(None, None, "x")
    with pytest.raises(TimeoutError):
        raise td.errors.DeadlineExceededError("x", missing=[0])
    with pytest.raises(NotImplementedError):
        raise td.errors.UnimplementedError(None, None, "x")


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_exception_type_from_error_code(name):
    assert td.errors.exception_type_from_error_code(TF_CLASSES[name]) is getattr(td.errors, name)


@pytest.mark.parametrize("code", [0, 17, 99, "3"])
def test_exception_type_from_an_unknown_code_raises_key_error(code):
    # Observed in TensorFlow 2.21: KeyError for 99 (and for OK, 0, which has no class).
    with pytest.raises(KeyError, match="exception_type_from_error_code"):
        td.errors.exception_type_from_error_code(code)


@pytest.mark.parametrize("name", sorted(TF_CLASSES))
def test_error_code_from_exception_type(name):
    assert td.errors.error_code_from_exception_type(getattr(td.errors, name)) == TF_CLASSES[name]


@pytest.mark.parametrize("cls", [ValueError, td.errors.OpError], ids=["ValueError", "OpError"])
def test_error_code_of_a_class_that_has_none_warns_and_is_unknown(cls):
    # Observed in TensorFlow 2.21: a UserWarning "Unknown class exception" (TF then returns an
    # UnknownError object; towerdist returns the code UNKNOWN).
    with pytest.warns(UserWarning, match="Unknown class exception"):
        assert td.errors.error_code_from_exception_type(cls) == td.errors.UNKNOWN


def test_error_code_of_a_tensorflow_class_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert td.errors.error_code_from_exception_type(td.errors.NotFoundError) == 5


def test_compat_v1_errors_is_td_errors():
    assert td.compat.v1.errors.exception_type_from_error_code(5) is td.errors.NotFoundError


# --- raise sites that use TensorFlow's class -------------------------------------------------


def test_profiler_start_while_running_raises_already_exists(tmp_path):
    # Observed in TensorFlow 2.21: AlreadyExistsError("Another profiler is running.").
    td.profiler.experimental.start(str(tmp_path))
    try:
        with pytest.raises(td.errors.AlreadyExistsError, match="Another profiler is running"):
            td.profiler.experimental.start(str(tmp_path / "second"))
    finally:
        td.profiler.experimental.stop(save=False)
    assert not profiler_lib.active


def test_splitting_a_gpu_raises_unimplemented_and_not_implemented(monkeypatch):
    monkeypatch.setattr(config_lib, "_gpu_count", lambda: 1)
    (gpu,) = td.config.list_physical_devices("GPU")
    configs = [td.config.LogicalDeviceConfiguration(), td.config.LogicalDeviceConfiguration()]
    with pytest.raises(td.errors.UnimplementedError, match="towerdist does not split a GPU") as info:
        td.config.set_logical_device_configuration(gpu, configs)
    assert isinstance(info.value, NotImplementedError)


def test_op_error_takes_error_code_by_keyword():
    error = td.errors.OpError(None, None, "msg", error_code=td.errors.ABORTED)
    assert error.error_code == 10 and not hasattr(error, "error_code_")


def _public_classes() -> list[str]:
    return sorted(name for name in td.errors.__all__ if isinstance(getattr(td.errors, name), type))


@pytest.mark.parametrize("name", _public_classes())
def test_each_class_names_its_public_module(name):
    # A traceback prints "towerdist.errors.ContextError: ...", the path users import.
    cls = getattr(td.errors, name)
    assert cls.__module__ == "towerdist.errors"
    assert f"{cls.__module__}.{cls.__qualname__}" == f"towerdist.errors.{name}"


def test_a_printed_traceback_shows_the_public_path():
    try:
        raise td.errors.ContextError("wrong context", api="Strategy.run()")
    except td.errors.ContextError as error:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    assert "towerdist.errors.ContextError: wrong context" in text
    assert "_src" not in text.splitlines()[-1]


@pytest.mark.parametrize("name", _public_classes())
def test_each_class_pickles_by_its_public_path(name):
    cls = getattr(td.errors, name)
    if issubclass(cls, td.errors.OpError):
        error: BaseException = cls(None, None, "m")
    elif name == "ContextError":
        error = cls("m", api="x")
    elif name == "MergeCallCountError":
        error = cls("m", counts={0: 1})
    else:
        error = cls("m")
    data = pickle.dumps(error)
    assert b"towerdist._src.errors" not in data
    clone = pickle.loads(data)
    assert type(clone) is cls and str(clone) == "m"
    assert vars(clone) == vars(error)  # the attributes callers act on (api, counts, ...) survive
