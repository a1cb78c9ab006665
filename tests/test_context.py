"""The context model: default replica, cross-replica, replica and update contexts (DESIGN 3).

Reference: tf_distribute_behaviour.md sections 1.1–1.3 and the nesting table of 3.4.
"""

from __future__ import annotations

import threading

import pytest

import towerdist as td
from towerdist._src import context
from towerdist._src import device as device_lib

from conftest import mirrored_param

WAIT = 10.0



def observe() -> dict[str, object]:
    return {
        "replica_context": td.distribute.get_replica_context(),
        "cross_replica": td.distribute.get_cross_replica_context(),
        "in_cross_replica": td.distribute.in_cross_replica_context(),
        "strategy": td.distribute.get_strategy(),
        "has_strategy": td.distribute.has_strategy(),
    }


# --- what each context looks like ---------------------------------------------------------


def test_outside_any_scope_is_the_default_replica_context():
    seen = observe()
    ctx = seen["replica_context"]
    assert isinstance(ctx, td.distribute.ReplicaContext)
    assert ctx.replica_id_in_sync_group == 0 and type(ctx.replica_id_in_sync_group) is int
    assert ctx.num_replicas_in_sync == 1
    assert seen["cross_replica"] is None and seen["in_cross_replica"] is False
    assert seen["has_strategy"] is False
    assert seen["strategy"] is td.distribute.get_strategy() and seen["strategy"].num_replicas_in_sync == 1


def test_inside_scope_is_cross_replica_context(mirrored_strategy):
    with mirrored_strategy.scope() as entered:
        seen = observe()
    assert entered is mirrored_strategy
    assert seen["replica_context"] is None
    assert seen["cross_replica"] is mirrored_strategy and seen["in_cross_replica"] is True
    assert seen["strategy"] is mirrored_strategy and seen["has_strategy"] is True


def test_inside_run_is_a_replica_context(mirrored_strategy):
    seen = mirrored_strategy.run(observe)
    replica_contexts = mirrored_strategy.experimental_local_results(seen["replica_context"])
    assert [int(ctx.replica_id_in_sync_group) for ctx in replica_contexts] == [0, 1]
    assert all(ctx.strategy is mirrored_strategy for ctx in replica_contexts)
    assert seen["cross_replica"] is None and seen["in_cross_replica"] is False
    assert seen["strategy"] is mirrored_strategy and seen["has_strategy"] is True


def test_inside_merge_fn_is_cross_replica_context(mirrored_strategy):
    seen = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: observe()))
    assert seen["replica_context"] is None
    assert seen["cross_replica"] is mirrored_strategy and seen["in_cross_replica"] is True


@pytest.mark.parametrize("where", ["outside", "scope", "run", "merge_fn"])
def test_exactly_one_of_replica_and_cross_replica_context_holds(mirrored_strategy, where):
    def check() -> bool:
        return (td.distribute.get_replica_context() is None) != (td.distribute.get_cross_replica_context() is None)

    if where == "outside":
        assert check()
    elif where == "scope":
        with mirrored_strategy.scope():
            assert check()
    elif where == "run":
        assert mirrored_strategy.run(check) is True
    else:
        assert mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: check())) is True


def test_one_device_and_default_run_give_an_int32_replica_id(one_device_cpu, default):
    for strategy in (one_device_cpu, default):
        rid = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
        assert rid == 0 and rid.dtype == td.int32


def test_context_is_per_thread(mirrored_strategy):
    seen: list[object] = []
    with mirrored_strategy.scope():
        thread = threading.Thread(target=lambda: seen.append(td.distribute.has_strategy()))
        thread.start()
        thread.join(WAIT)
    assert seen == [False]


# --- scope nesting, as in TensorFlow --------------------------------------------------------


def test_reentering_the_same_scope_is_counted(mirrored_strategy):
    with mirrored_strategy.scope():
        with mirrored_strategy.scope():
            assert td.distribute.get_strategy() is mirrored_strategy
        assert td.distribute.in_cross_replica_context()
    assert not td.distribute.has_strategy()


def test_the_same_scope_object_can_be_reentered(mirrored_strategy):
    scope = mirrored_strategy.scope()
    with scope:
        with scope:
            assert td.distribute.in_cross_replica_context()
        assert td.distribute.in_cross_replica_context()
    assert not td.distribute.has_strategy()


def test_another_strategys_scope_inside_a_scope_raises(mirrored_strategy, other_mirrored_strategy):
    with mirrored_strategy.scope():
        with pytest.raises(td.errors.ContextError, match="Mixing different strategies"):
            with other_mirrored_strategy.scope():
                pass
        assert td.distribute.get_strategy() is mirrored_strategy
    assert not td.distribute.has_strategy()


def test_scope_inside_run_raises(mirrored_strategy):
    def fn():
        with mirrored_strategy.scope():
            return "entered"

    with pytest.raises(td.errors.ContextError, match=r"Strategy.scope\(\) must be called in cross-replica context"):
        mirrored_strategy.run(fn)


def test_run_inside_run_raises(mirrored_strategy):
    with pytest.raises(td.errors.ContextError, match=r"Strategy.run\(\) must be called in cross-replica context") as info:
        mirrored_strategy.run(lambda: mirrored_strategy.run(lambda: 1))
    assert "replica" in str(info.value) and "merge_call()" in str(info.value)
    assert mirrored_strategy.run(lambda: 3) == 3


def test_other_strategys_scope_inside_run_raises(mirrored_strategy, other_mirrored_strategy):
    def fn():
        with other_mirrored_strategy.scope():
            return "entered"

    with pytest.raises(td.errors.ContextError, match="Mixing different strategies"):
        mirrored_strategy.run(fn)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, pr: s.run(lambda: 1),
        lambda s, pr: s.reduce("sum", pr, axis=None),
        lambda s, pr: s.extended.reduce_to("sum", pr, "/cpu:0"),
        lambda s, pr: s.extended.batch_reduce_to("sum", [(pr, "/cpu:0")]),
        lambda s, pr: s.extended.broadcast_to(1.0, "/cpu:0"),
        lambda s, pr: s.gather(pr, axis=0),
    ],
    ids=["run", "reduce", "reduce_to", "batch_reduce_to", "broadcast_to", "gather"],
)
def test_cross_replica_apis_of_another_strategy_inside_a_scope_raise(mirrored_strategy, other_mirrored_strategy, call):
    per_replica = other_mirrored_strategy.experimental_distribute_values_from_function(lambda c: td.constant([1.0]))
    with mirrored_strategy.scope():
        with pytest.raises(td.errors.ContextError, match="Mixing different strategies"):
            call(other_mirrored_strategy, per_replica)


def test_default_strategy_scope_inside_a_scope_raises(mirrored_strategy, default):
    with mirrored_strategy.scope():
        with pytest.raises(td.errors.ContextError, match="Must not nest strategy scopes"):
            with default.scope():
                pass


def test_a_scope_inside_the_default_strategy_scope_is_allowed(mirrored_strategy, default):
    with default.scope() as entered:
        assert entered is default
        assert not td.distribute.has_strategy()
        with mirrored_strategy.scope():
            assert td.distribute.get_strategy() is mirrored_strategy


def test_scope_is_left_clean_when_the_block_raises(mirrored_strategy):
    with pytest.raises(ZeroDivisionError):
        with mirrored_strategy.scope():
            with td.device("CPU:1"):
                raise ZeroDivisionError("raised inside the scope")
    assert not td.distribute.has_strategy()
    assert device_lib.current() is None


def _in_thread(fn):
    """Runs ``fn`` on a new thread; returns the exception it raised (or None)."""
    raised: list[BaseException | None] = []

    def target():
        try:
            fn()
        except BaseException as error:  # handed to the test, which asserts on it
            raised.append(error)
        else:
            raised.append(None)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return raised[0]


@pytest.mark.parametrize("strategy_name", [mirrored_param(2), "default"])
def test_a_scope_exited_on_another_thread_raises_and_leaves_both_threads_intact(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    scope = strategy.scope()
    scope.__enter__()
    try:
        before = td.distribute.get_strategy()
        error = _in_thread(lambda: scope.__exit__(None, None, None))
        assert isinstance(error, td.errors.ContextError)
        assert "scope() was exited on thread" in str(error) and "which did not enter it" in str(error)
        assert "MainThread" in str(error)  # names the thread that entered it
        assert td.distribute.get_strategy() is before  # this thread's state is untouched
    finally:
        scope.__exit__(None, None, None)
    assert not td.distribute.has_strategy()
    with strategy.scope():
        assert td.distribute.get_strategy() is strategy


def test_one_scope_object_entered_on_two_threads_exits_per_thread(mirrored_strategy):
    scope = mirrored_strategy.scope()
    entered, done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other():
        with scope:
            entered.set()
            assert done.wait(10)
            seen.append(td.distribute.get_strategy() is mirrored_strategy)
        seen.append(td.distribute.has_strategy())

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(10)
    with scope:
        assert td.distribute.get_strategy() is mirrored_strategy
    assert not td.distribute.has_strategy()  # leaving here did not disturb the other thread
    done.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert seen == [True, False]


def test_one_device_scope_sets_its_device(one_device_cpu):
    with one_device_cpu.scope():
        assert device_lib.current() == device_lib.parse("/cpu:0")
    assert device_lib.current() is None


# --- experimental_set_strategy ------------------------------------------------------------


def test_experimental_set_strategy_enters_and_clears(mirrored_strategy, other_mirrored_strategy):
    try:
        td.distribute.experimental_set_strategy(mirrored_strategy)
        assert td.distribute.has_strategy() and td.distribute.in_cross_replica_context()
        td.distribute.experimental_set_strategy(other_mirrored_strategy)
        assert td.distribute.get_strategy() is other_mirrored_strategy
    finally:
        td.distribute.experimental_set_strategy(None)
    assert not td.distribute.has_strategy()


def test_experimental_set_strategy_inside_a_scope_raises(mirrored_strategy, other_mirrored_strategy):
    with mirrored_strategy.scope():
        with pytest.raises(td.errors.ContextError, match=r"experimental_set_strategy\(\) must not be called inside"):
            td.distribute.experimental_set_strategy(other_mirrored_strategy)
    assert not td.distribute.has_strategy()


# --- merge_call from the wrong place ------------------------------------------------------


def test_merge_call_in_cross_replica_context_raises(mirrored_strategy):
    ctx = mirrored_strategy.run(lambda: td.distribute.get_replica_context())
    stale = mirrored_strategy.experimental_local_results(ctx)[0]
    with mirrored_strategy.scope():
        with pytest.raises(td.errors.ContextError, match=r"ReplicaContext.merge_call\(\) must be called in a replica context"):
            stale.merge_call(lambda s: None)


def test_stale_replica_context_outside_any_scope_raises(mirrored_strategy):
    ctx = mirrored_strategy.experimental_local_results(mirrored_strategy.run(td.distribute.get_replica_context))[1]
    with pytest.raises(td.errors.ContextError, match="Mismatching strategies"):
        ctx.merge_call(lambda s: None)


def test_stale_replica_context_in_another_run_raises(mirrored_strategy):
    first = mirrored_strategy.experimental_local_results(mirrored_strategy.run(td.distribute.get_replica_context))
    with pytest.raises(td.errors.ContextError, match="Mismatching ReplicaContext"):
        mirrored_strategy.run(lambda: first[0].merge_call(lambda s: None))
    assert mirrored_strategy.run(lambda: "ok") == "ok"


def test_default_replica_context_merge_call_runs_in_cross_replica_context(default):
    seen = td.distribute.get_replica_context().merge_call(
        lambda strategy, x: (strategy, x, td.distribute.in_cross_replica_context()), args=(5,)
    )
    assert seen == (default, 5, True)
    assert not td.distribute.in_cross_replica_context()


def test_replica_context_rejects_a_non_integer_id(mirrored_strategy):
    with pytest.raises(ValueError, match="replica_id_in_sync_group can only be an integer"):
        td.distribute.ReplicaContext(mirrored_strategy, "0")


# --- update context -----------------------------------------------------------------------


def test_get_update_device_is_none_outside_an_update():
    assert td.distribute.get_update_device() is None


def test_update_context_names_its_device_and_replica():
    spec = device_lib.parse("CPU:2")
    with context.UpdateContext(spec, replica_id=2):
        assert td.distribute.get_update_device() == spec.name
        assert context.current_replica_id() == 2
        assert device_lib.current() == spec
    assert td.distribute.get_update_device() is None
    assert context.current_replica_id() is None
