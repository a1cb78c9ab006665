"""Device names (``towerdist._src.device``) and the ``td.device`` scope.

Canonical form from reference section 0: ``device_util.canonicalize("GPU:0")`` ->
``/job:localhost/replica:0/task:0/device:GPU:0`` and ``"/cpu:3"`` -> ``.../device:CPU:3``.
"""

from __future__ import annotations

import threading

import pytest

import towerdist as td
from towerdist._src import device as device_lib

LOCAL = "/job:localhost/replica:0/task:0"


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("GPU:1", f"{LOCAL}/device:GPU:1"),
        ("/gpu:1", f"{LOCAL}/device:GPU:1"),
        ("/device:GPU:1", f"{LOCAL}/device:GPU:1"),
        ("gpu:1", f"{LOCAL}/device:GPU:1"),
        ("device:GPU:1", f"{LOCAL}/device:GPU:1"),
        ("GPU:0", f"{LOCAL}/device:GPU:0"),
        ("/job:localhost/replica:0/task:0/device:CPU:3", f"{LOCAL}/device:CPU:3"),
        ("/cpu:3", f"{LOCAL}/device:CPU:3"),
        ("CPU:0", f"{LOCAL}/device:CPU:0"),
        ("cpu:0", f"{LOCAL}/device:CPU:0"),
        ("/device:CPU:0", f"{LOCAL}/device:CPU:0"),
        ("/device:cpu:12", f"{LOCAL}/device:CPU:12"),
        # "*" is an unspecified index; canonicalisation fills in the default index 0.
        ("/device:CPU:*", f"{LOCAL}/device:CPU:0"),
        ("/job:worker/replica:0/task:1/device:GPU:2", "/job:worker/replica:0/task:1/device:GPU:2"),
    ],
)
def test_canonicalize_accepts_every_tf_spelling(spelling, canonical):
    assert device_lib.canonicalize(spelling) == canonical


@pytest.mark.parametrize(
    ("spelling", "device_type", "index"),
    [("GPU:1", "GPU", 1), ("/cpu:3", "CPU", 3), ("/device:CPU:0", "CPU", 0), ("gpu:7", "GPU", 7)],
)
def test_parse_fills_type_and_index(spelling, device_type, index):
    spec = device_lib.parse(spelling)
    assert (spec.job, spec.replica, spec.task) == ("localhost", 0, 0)
    assert (spec.device_type, spec.device_index) == (device_type, index)


@pytest.mark.parametrize("spelling", ["GPU:1", "/gpu:1", "/device:GPU:1", f"{LOCAL}/device:GPU:1"])
def test_spellings_of_one_device_parse_to_equal_specs(spelling):
    assert device_lib.parse(spelling) == device_lib.parse("GPU:1")
    assert hash(device_lib.parse(spelling)) == hash(device_lib.parse("GPU:1"))


def test_parse_of_a_device_spec_returns_it():
    spec = device_lib.parse("CPU:2")
    assert device_lib.parse(spec) is spec


def test_parse_accepts_a_logical_device_object():
    logical = td.config.list_logical_devices("CPU")[2]
    assert device_lib.canonicalize(logical) == f"{LOCAL}/device:CPU:2"


@pytest.mark.parametrize(
    ("spelling", "short"),
    [
        ("CPU:0", "/cpu:0"),
        ("/device:GPU:1", "/gpu:1"),
        (f"{LOCAL}/device:CPU:3", "/cpu:3"),
        ("/job:worker/replica:0/task:1/device:GPU:2", "/job:worker/replica:0/task:1/device:GPU:2"),
    ],
)
def test_short_name(spelling, short):
    assert device_lib.parse(spelling).short_name == short


def test_str_of_a_spec_is_its_canonical_name():
    assert str(device_lib.parse("/gpu:1")) == f"{LOCAL}/device:GPU:1"


@pytest.mark.parametrize(
    "spelling",
    ["", "/", "CPU", "banana", "CPU:x", "CPU:-1", "CPU:0:1", "/job:localhost/replica:a/device:CPU:0", "/task:/cpu:0"],
)
def test_invalid_device_name_raises_value_error_naming_it(spelling):
    with pytest.raises(ValueError, match="Invalid device name") as info:
        device_lib.parse(spelling)
    assert repr(spelling) in str(info.value)


@pytest.mark.parametrize("spelling", ["TPU:0", "/device:TPU:0", "/xla_gpu:0"])
def test_unsupported_device_type_raises_value_error(spelling):
    with pytest.raises(ValueError, match="Unsupported device type") as info:
        device_lib.parse(spelling)
    assert repr(spelling) in str(info.value)


@pytest.mark.parametrize("not_a_device", [None, 0, 1.5, ["CPU:0"]])
def test_non_string_device_raises_type_error(not_a_device):
    with pytest.raises(TypeError, match="A device must be given as a string"):
        device_lib.canonicalize(not_a_device)


# --- td.device scope --------------------------------------------------------------------


def test_no_device_scope_by_default():
    assert device_lib.current() is None


def test_device_scope_sets_current_device():
    with td.device("/gpu:1"):
        assert device_lib.current() == device_lib.parse("GPU:1")
    assert device_lib.current() is None


def test_nested_device_scopes_restore_the_outer_one():
    with td.device("CPU:1"):
        with td.device("CPU:2"):
            assert device_lib.current() == device_lib.parse("CPU:2")
        assert device_lib.current() == device_lib.parse("CPU:1")
    assert device_lib.current() is None


def test_device_none_clears_the_scope_inside_a_block():
    with td.device("CPU:1"):
        with td.device(None):
            assert device_lib.current() is None
        assert device_lib.current() == device_lib.parse("CPU:1")


def test_device_scope_is_restored_after_an_exception():
    with td.device("CPU:1"):
        with pytest.raises(KeyError, match="boom"):
            with td.device("CPU:2"):
                raise KeyError("boom")
        assert device_lib.current() == device_lib.parse("CPU:1")
    assert device_lib.current() is None


def test_invalid_device_scope_raises_and_leaves_the_scope_unchanged():
    with td.device("CPU:1"):
        with pytest.raises(ValueError, match="Invalid device name"):
            with td.device("CPU:x"):
                pass
        assert device_lib.current() == device_lib.parse("CPU:1")


def test_device_scope_is_per_thread():
    seen = []
    with td.device("CPU:3"):
        thread = threading.Thread(target=lambda: seen.append(device_lib.current()))
        thread.start()
        thread.join(timeout=10)
        assert device_lib.current() == device_lib.parse("CPU:3")
    assert not thread.is_alive()
    assert seen == [None]


def test_device_scope_in_another_thread_does_not_leak_here():
    entered = threading.Event()
    release = threading.Event()
    seen = []

    def other():
        with td.device("CPU:5"):
            seen.append(device_lib.current())
            entered.set()
            release.wait(timeout=10)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert entered.wait(timeout=10)
        assert device_lib.current() is None
    finally:
        release.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert seen == [device_lib.parse("CPU:5")]
