"""``td.name_scope`` and ``td.compat.v1.name_scope``: the names of variables created within them.

Every expected name is what TensorFlow 2.21 gives (eager, 2 logical CPUs).
"""

from __future__ import annotations

import threading

import pytest

import towerdist as td


def test_variables_take_the_scope_and_nested_scopes_join():
    with td.name_scope("main") as scope:
        a = td.Variable(1.0, name="a")
        unnamed = td.Variable(1.0)
        with td.name_scope("foo") as inner:
            c = td.Variable(1.0, name="c")
    assert (scope, inner) == ("main/", "main/foo/")
    assert (a.name, unnamed.name, c.name) == ("main/a:0", "main/Variable:0", "main/foo/c:0")
    assert td.Variable(1.0, name="a").name == "a:0"  # restored


def test_distributed_variables_and_their_components_take_the_scope(mirrored_strategy):
    with td.name_scope("main"), mirrored_strategy.scope():
        m = td.Variable(1.0, name="a")
        s = td.Variable(1.0, name="s", synchronization=td.VariableSynchronization.ON_READ)
    assert [m.name, *(c.name for c in m.values)] == ["main/a:0", "main/a:0", "main/a/replica_1:0"]
    assert [s.name, *(c.name for c in s.values)] == ["main/s:0", "main/s:0", "main/s/replica_1:0"]


@pytest.mark.parametrize(
    ("scope_name", "scope", "variable"),
    [
        ("main/", "main/", "main/x:0"),  # a trailing "/" makes the whole scope
        ("", "", "x:0"),  # the empty name goes back to the top
        ("/", "/", "/x:0"),
        ("a b", "outer/a b/", "outer/a b/x:0"),  # no characters are refused in eager mode
        ("a//b", "outer/a//b/", "outer/a//b/x:0"),
    ],
)
def test_edge_names_inside_a_scope(scope_name, scope, variable):
    with td.name_scope("outer"), td.name_scope(scope_name) as entered:
        assert entered == scope
        assert td.Variable(1.0, name="x").name == variable


@pytest.mark.parametrize(("name", "expected"), [("pq/", "pq:0"), ("a/b", "outer/a/b:0"), ("/lead", "outer//lead:0"), ("", ":0")])
def test_variable_names_inside_a_scope(name, expected):
    with td.name_scope("outer"):
        assert td.Variable(1.0, name=name).name == expected


def test_a_scope_entered_twice_gives_the_same_names():
    names = []
    for _ in range(2):
        with td.name_scope("main") as scope:
            names.append((scope, td.Variable(1.0, name="a").name))
    assert names == [("main/", "main/a:0"), ("main/", "main/a:0")]


def test_the_same_scope_object_entered_while_open_nests():
    scope = td.name_scope("re")
    with scope as outer, scope as inner:
        assert (outer, inner) == ("re/", "re/re/")
    assert td.Variable(1.0, name="x").name == "x:0"


def test_name_is_the_name_given():
    assert td.name_scope("main/").name == "main/"
    with td.name_scope("o"):
        scope = td.name_scope("p")
        with scope as entered:
            assert (scope.name, entered) == ("p", "o/p/")


@pytest.mark.parametrize("name", [None, 3])
def test_a_name_that_is_not_a_string_raises_value_error(name):
    with pytest.raises(ValueError, match="name for name_scope must be a string"):
        td.name_scope(name)


def test_the_scope_is_restored_after_an_error():
    with pytest.raises(KeyError), td.name_scope("boom"):
        raise KeyError
    assert td.Variable(1.0, name="z").name == "z:0"


def test_the_scope_is_per_thread():
    names = []
    with td.name_scope("threaded"):
        worker = threading.Thread(target=lambda: names.append(td.Variable(1.0, name="t").name))
        worker.start()
        worker.join()
    assert names == ["t:0"]


def test_mirrored_replicas_start_at_the_top_and_take_scopes_entered_inside(mirrored_strategy):
    def outside():
        return td.Variable(1.0, name="r")

    def inside():
        with td.name_scope("inner"):
            return td.Variable(1.0, name="r")

    with td.name_scope("outer"):
        r = mirrored_strategy.run(outside)
        n = mirrored_strategy.run(inside)
    assert [c.name for c in r.values] == ["r:0", "r/replica_1:0"]
    assert [c.name for c in n.values] == ["inner/r:0", "inner/r/replica_1:0"]


def test_single_device_strategies_run_in_the_callers_scope(one_device_cpu, default):
    with td.name_scope("outer"):
        with one_device_cpu.scope():
            assert one_device_cpu.run(lambda: td.Variable(1.0, name="r").name) == "outer/r:0"
        assert default.run(lambda: td.Variable(1.0, name="r").name) == "outer/r:0"


def test_compat_v1_name_scope_takes_a_default_name():
    v1 = td.compat.v1.name_scope
    with v1(None, "dn") as scope:
        assert scope == "dn/"
    with v1("v1s") as first, v1("v1s") as second:
        assert (first, second) == ("v1s/", "v1s/v1s/")
    with v1(None) as top:
        assert top == ""
    with v1("o"), v1(None, "d") as nested:
        assert nested == "o/d/"
        assert td.Variable(1.0, name="a").name == "o/d/a:0"
    assert v1("x").name == "x"
    with pytest.raises(ValueError, match="name for name_scope must be a string"):
        v1(3)
