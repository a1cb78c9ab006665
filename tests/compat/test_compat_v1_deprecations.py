"""The TF 1.x tower dialect: the one-time ``DeprecationWarning`` of every old name (``towerdist._src.aliases``)."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src import aliases
from towerdist.testing.pytest_plugin import mirrored_strategy_for

import compat_v1_helpers
from compat_v1_helpers import tower

# The helpers' fixtures, by name (an import would read as unused)
fresh_warnings = compat_v1_helpers.fresh_warnings
strategy = compat_v1_helpers.strategy

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# --- 4. deprecation warnings ---------------------------------------------------------------


@contextmanager
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def deprecations(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


def here() -> int:
    """The line number of the caller's current line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def assert_one_warning_at(caught: list[warnings.WarningMessage], line: int, old: str, new: str) -> None:
    found = deprecations(caught)
    assert len(found) == 1, [str(w.message) for w in found]
    (w,) = found
    assert w.filename == __file__
    assert w.lineno == line
    assert old in str(w.message)
    assert new in str(w.message)


def test_module_attribute_warns_once_at_the_users_line():
    import towerdist.compat.v1 as tf

    with recorded() as caught:
        first = tf.get_tower_context; line = here()
    assert_one_warning_at(caught, line, "towerdist.compat.v1.get_tower_context", "get_replica_context()")
    with recorded() as caught:
        second = tf.get_tower_context
    assert deprecations(caught) == []
    assert first is second


def test_import_form_warns_once_at_the_import_line():
    with recorded() as caught:
        line = here() + 1  # the import on the next line
        from towerdist.compat.v1 import get_tower_context
    assert_one_warning_at(caught, line, "towerdist.compat.v1.get_tower_context", "get_replica_context()")
    assert get_tower_context().tower_id == 0
    with recorded() as caught:
        from towerdist.compat.v1 import get_tower_context as again
    assert deprecations(caught) == []
    assert again is get_tower_context


def test_contrib_class_warns_once_at_the_users_line():
    with recorded() as caught:
        cls = td.contrib.distribute.MirroredStrategy; line = here()
    assert_one_warning_at(
        caught, line, "towerdist.contrib.distribute.MirroredStrategy", "towerdist.compat.v1.distribute.MirroredStrategy"
    )
    with recorded() as caught:
        assert td.contrib.distribute.MirroredStrategy is cls
    assert deprecations(caught) == []


def test_collective_hints_warns_once_at_the_users_line():
    with recorded() as caught:
        hints = td.distribute.experimental.CollectiveHints; line = here()
    assert_one_warning_at(
        caught,
        line,
        "towerdist.distribute.experimental.CollectiveHints",
        "towerdist.distribute.experimental.CommunicationOptions",
    )
    with recorded() as caught:
        options = hints(bytes_per_pack=1024)
        assert td.distribute.experimental.CollectiveHints is hints
    assert deprecations(caught) == []
    assert isinstance(options, td.distribute.experimental.CommunicationOptions)
    assert options.bytes_per_pack == 1024


def test_strategy_methods_warn_once_at_the_users_line():
    strategy = mirrored_strategy_for(2)
    with recorded() as caught:
        run_v2 = strategy.experimental_run_v2; line = here()
    assert_one_warning_at(caught, line, "Strategy.experimental_run_v2", "Strategy.run()")
    with recorded() as caught:
        unwrap = strategy.unwrap; line = here()
    assert_one_warning_at(caught, line, "Strategy.unwrap", "Strategy.experimental_local_results()")
    with recorded() as caught:
        assert strategy.experimental_run_v2(lambda: 1) == run_v2(lambda: 1) == 1
        assert strategy.unwrap(5) == unwrap(5) == (5,)
    assert deprecations(caught) == []


def test_tower_method_warns_once_where_it_is_called_and_property_where_it_is_read():
    strategy = tower(2)
    with recorded() as caught:
        call = strategy.call_for_each_tower
    assert deprecations(caught) == []  # a method defined in the class body warns when called
    with recorded() as caught:
        assert call(lambda: 7) == 7; line = here()
    assert_one_warning_at(caught, line, "compat.v1.MirroredStrategy.call_for_each_tower", "Strategy.run(")
    with recorded() as caught:
        count = strategy.num_towers; line = here()
    assert_one_warning_at(caught, line, "compat.v1.MirroredStrategy.num_towers", "Strategy.num_replicas_in_sync")
    assert count == 2
    with recorded() as caught:
        assert strategy.num_towers == 2
        assert call(lambda: 7) == 7
    assert deprecations(caught) == []


def test_enum_alias_warns_once_at_the_users_line():
    with recorded() as caught:
        member = tf.VariableAggregation.ONLY_FIRST_TOWER; line = here()
    assert_one_warning_at(caught, line, "VariableAggregation.ONLY_FIRST_TOWER", "VariableAggregation.ONLY_FIRST_REPLICA")
    assert member is tf.VariableAggregation.ONLY_FIRST_REPLICA
    with recorded() as caught:
        assert tf.VariableAggregation.ONLY_FIRST_TOWER is member
    assert deprecations(caught) == []


def test_an_old_name_used_by_every_tower_warns_once_at_the_users_line():
    strategy = tower(4)
    lines = []

    def fn():
        ctx = tf.get_tower_context(); lines.append(here())
        return ctx.tower_id

    with recorded() as caught:
        assert strategy.run(fn) is not None
    found = deprecations(caught)
    assert len(found) == 1, [str(w.message) for w in found]
    assert found[0].filename == __file__ and found[0].lineno == lines[0]
    assert "get_tower_context" in str(found[0].message)


def test_class_level_access_does_not_warn_and_has_a_signature():
    with recorded() as caught:
        run_v2 = td.distribute.Strategy.experimental_run_v2
        call = tf.distribute.MirroredStrategy.call_for_each_tower
        num_towers = tf.distribute.MirroredStrategy.num_towers
    assert deprecations(caught) == []
    assert list(inspect.signature(run_v2).parameters) == ["self", "fn", "args", "kwargs", "options"]
    assert list(inspect.signature(call).parameters) == ["self", "fn", "args", "kwargs"]
    assert isinstance(num_towers, property)
    assert num_towers.fget(tower(2)) == 2


def _owner_object(alias: aliases.Alias) -> Any:
    if alias.owner == aliases.STRATEGY:
        return mirrored_strategy_for(2)
    if alias.owner == aliases.TOWER_STRATEGY:
        return tower(2)
    if alias.owner == aliases.AGGREGATION:
        return td.VariableAggregation
    if alias.owner == getattr(aliases, "EXTENDED", None):
        return mirrored_strategy_for(2).extended
    if alias.owner == aliases.METRIC:
        return td.metrics.Mean()
    assert alias.owner.startswith("towerdist."), f"no test object for the owner of {alias.old}"
    return importlib.import_module(alias.owner)


def _tower_variable(strategy: Any) -> Any:
    with strategy.scope():
        return tf.Variable(1.0)


# One call of each tower-era method, with the plain result it must give on 2 towers.
_TOWER_CALLS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], bool]]] = {
    "call_for_each_tower": (lambda s: s.call_for_each_tower(lambda: 3), lambda s, r: r == 3),
    "tower_local_var_scope": (lambda s: s.tower_local_var_scope("sum"), lambda s, r: hasattr(r, "__enter__")),
    "unwrap": (lambda s: s.unwrap(5), lambda s, r: r == [5]),
    "fetch": (lambda s: s.fetch(2.0), lambda s, r: float(r) == 2.0),
    "map": (lambda s: s.map([1, 2, 3], lambda x: x * 10), lambda s, r: s.reduce("sum", r) is not None),
    "distribute_dataset": (
        lambda s: s.distribute_dataset(tf.data.Dataset.range(4)),
        lambda s, r: [list(s.unwrap(x)) for x in r] == [[0, 1], [2, 3]],
    ),
    "batch_reduce": (lambda s: s.batch_reduce("mean", [(1.0, None)]), lambda s, r: len(r) == 1),
    "broadcast": (
        lambda s: s.broadcast(np.ones(2)),
        lambda s, r: len(s.unwrap(r)) == 2 and all((x == 1.0).all() for x in s.unwrap(r)),
    ),
    "update": (
        lambda s: s.update(_tower_variable(s), lambda v: v.assign_add(1.0)),
        lambda s, r: [float(np.asarray(x)) for x in s.unwrap(r)] == [2.0, 2.0],
    ),
    "update_non_slot": (
        lambda s: s.update_non_slot(s.extended.non_slot_devices([]), lambda: 4),
        lambda s, r: r == 4,
    ),
    "non_slot_devices": (lambda s: s.non_slot_devices([]), lambda s, r: len(r) == 2),
    "read_var": (lambda s: s.read_var(_tower_variable(s)), lambda s, r: float(np.asarray(r)) == 1.0),
}


def test_every_tower_method_has_a_sample_call():
    names = {a.name for a in aliases.all_aliases() if a.owner == aliases.TOWER_STRATEGY and a.kind == "method"}
    assert names == set(_TOWER_CALLS)


@pytest.mark.parametrize(
    "alias",
    [a for a in aliases.all_aliases() if a.owner == aliases.TOWER_STRATEGY and a.kind == "method"],
    ids=lambda a: a.old,
)
def test_every_tower_method_warns_once_when_called_and_then_works(alias):
    strategy = tower(2)
    call, check = _TOWER_CALLS[alias.name]
    method = getattr(strategy, alias.name)
    assert method.__func__ is alias.target and method.__self__ is strategy
    with recorded() as caught:
        result = call(strategy)
    # The warning points at the caller's line: the sample call in _TOWER_CALLS.
    assert_one_warning_at(caught, call.__code__.co_firstlineno, alias.old, alias.new)
    assert check(strategy, result)
    with recorded() as caught:
        assert check(strategy, call(strategy))
    assert deprecations(caught) == []


@pytest.mark.parametrize(
    "alias",
    [a for a in aliases.all_aliases() if not (a.owner == aliases.TOWER_STRATEGY and a.kind == "method")],
    ids=lambda a: a.old,
)
def test_every_alias_resolves_and_warns_once_naming_its_replacement(alias):
    owner = _owner_object(alias)
    target = alias.target
    with recorded() as caught:
        value = getattr(owner, alias.name); line = here()
    assert_one_warning_at(caught, line, alias.old, alias.new)

    if alias.kind == "method":
        assert value.__func__ is target and value.__self__ is owner
    elif alias.kind == "property":
        expected = target.fget(owner) if isinstance(target, property) else target(owner)
        if isinstance(expected, td.distribute.DistributedValues):
            assert type(value) is type(expected) and value.values == expected.values
        else:
            assert value == expected
    else:
        assert value is target

    with recorded() as caught:
        getattr(owner, alias.name)
    assert deprecations(caught) == []


@pytest.mark.parametrize(
    "module_name", ["towerdist.compat.v1", "towerdist.compat.v1.distribute", "towerdist.contrib.distribute"]
)
def test_dir_lists_the_old_names(module_name):
    module = importlib.import_module(module_name)
    old_names = {a.name for a in aliases.all_aliases() if a.owner == module_name}
    assert old_names and old_names <= set(dir(module))
    assert "get_tower_context" in dir(module)


def test_dir_of_compat_v1_keeps_its_own_names():
    listing = dir(tf)
    assert {"distribute", "Variable", "VariableAggregation", "get_tower_context", "get_cross_tower_context"} <= set(
        listing
    )


@pytest.mark.parametrize(
    "module_name",
    [
        "towerdist.compat.v1",
        "towerdist.compat.v1.distribute",
        "towerdist.contrib.distribute",
        "towerdist.distribute.experimental",
    ],
)
def test_unknown_attributes_raise_attribute_error_naming_the_module(module_name):
    module = importlib.import_module(module_name)
    with recorded() as caught:
        with pytest.raises(AttributeError, match=re.escape(module_name)) as info:
            module.get_tower_contxt  # noqa: B018
    assert "get_tower_contxt" in str(info.value)
    assert deprecations(caught) == []
