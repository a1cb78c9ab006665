"""The drop-in promise, tested: TensorFlow's tf.distribute names exist in towerdist with the same signatures.

``tests/data/tf_distribute_api.json`` is written by ``tools/dump_tf_api.py`` from the
installed TensorFlow (2.21): every public name of ``tf.distribute`` and
``tf.distribute.experimental``, the public members of ``Strategy``, ``StrategyExtended``
and ``ReplicaContext``, and the ``StrategyExtended`` members TF 2.x keeps in
``tf.compat.v1``. ``LEGACY`` adds the TF 2.0-2.3 names TF 2.21 no longer has.

Every promised name must exist in towerdist with the same kind (module, class, enum,
function, method, property) and, for callables, the same parameters (names, kinds and
default values; annotations are ignored). ``EXCLUDED`` lists what towerdist does not
provide because it needs TPUs, TensorFlow graphs or TensorFlow's gRPC cluster runtime,
each with its reason. ``PENDING`` lists promised names not built yet: their tests are
strict xfails, so building one forces its removal from the list.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import json
import pathlib
from typing import Any

import pytest

import towerdist as td

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("dump_tf_api", ROOT / "tools" / "dump_tf_api.py")
assert _spec is not None and _spec.loader is not None
dump_tf_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dump_tf_api)

API = json.loads((ROOT / "tests" / "data" / "tf_distribute_api.json").read_text())

_TPU = "needs TPU hardware"
_CLUSTER = (
    "needs TensorFlow's gRPC cluster runtime (tf.distribute.Server, remote workers and parameter "
    "servers); towerdist scales out over MPI only (DESIGN section 9)"
)

EXCLUDED = {
    "distribute.TPUStrategy": _TPU,
    "distribute.experimental.TPUStrategy": _TPU,
    "distribute.ParameterServerStrategy": _CLUSTER,
    "distribute.experimental.ParameterServerStrategy": _CLUSTER,
    "distribute.Server": _CLUSTER,
    "distribute.coordinator": _CLUSTER + " (ClusterCoordinator schedules remote functions)",
    "distribute.experimental.coordinator": _CLUSTER + " (ClusterCoordinator schedules remote functions)",
    "distribute.experimental.rpc": _CLUSTER + " (gRPC remote procedure calls)",
    "distribute.experimental.partitioners": _CLUSTER + " (variable sharding across parameter servers)",
    "distribute.cluster_resolver": (
        "resolves TF_CONFIG/Slurm/TPU clusters into gRPC server addresses; under MPI the rank and size "
        "come from the launcher"
    ),
    "distribute.experimental.PreemptionCheckpointHandler": (
        "needs TensorFlow's coordination service across workers to agree on a preemption step"
    ),
    "distribute.experimental.PreemptionWatcher": "needs TensorFlow's coordination service across workers",
    "distribute.experimental.TerminationConfig": "configures PreemptionCheckpointHandler, which is excluded",
    "StrategyExtended.experimental_run_steps_on_iterator": (
        "TF 1.x graph-mode step loop (MultiStepContext) for Estimator and TPUs; needs graphs"
    ),
}

PENDING: dict[str, str] = {}

# Names whose TensorFlow signature is not the one users call: the documented call is promised instead.
DOCUMENTED_SIGNATURES = {
    # TF's class is a factory whose __new__ takes (*args, **kwargs) and returns an Options.
    "distribute.experimental.CommunicationOptions": (
        "(bytes_per_pack=0, timeout_seconds=None, implementation=<CommunicationImplementation.AUTO: 'AUTO'>)"
    ),
}

# Abstract types users receive from a strategy but never construct: only their presence is promised.
NOT_CONSTRUCTED = {
    "distribute.DistributedDataset": "users get it from experimental_distribute_dataset()",
    "distribute.DistributedIterator": "users get it from iter() of a distributed dataset",
    "distribute.DistributedValues": "users get PerReplica/Mirrored values from run() and reductions",
}

# TF 2.0-2.3 names that TF 2.21 no longer has, with the signature of their last TF version.
LEGACY = {
    "Strategy.experimental_run_v2": {"kind": "method", "signature": "(fn, args=(), kwargs=None, options=None)"},
}

PROMISED = {**API["names"], **LEGACY}


def _lookup(name: str) -> Any:
    """The towerdist object for a promised name, or raises AttributeError."""
    head, _, rest = name.partition(".")
    if head in ("Strategy", "StrategyExtended", "ReplicaContext"):
        owner: Any = getattr(td.distribute, head)
        return inspect.getattr_static(owner, rest) if rest else owner
    obj: Any = td
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return "enum"
    if inspect.isclass(obj):
        return "class"
    if isinstance(obj, property):
        return "property"
    return "function"


def _member_kind_and_signature(owner: str, member: str) -> tuple[str, str | None]:
    cls = getattr(td.distribute, owner)
    raw = inspect.getattr_static(cls, member)
    if isinstance(raw, property):
        return "property", None
    return "method", dump_tf_api.signature(getattr(cls, member))


def _check(name: str, expected: dict[str, Any]) -> None:
    owner, _, member = name.partition(".")
    if owner in ("Strategy", "StrategyExtended", "ReplicaContext"):
        try:
            kind, signature = _member_kind_and_signature(owner, member)
        except AttributeError:
            pytest.fail(f"td.distribute.{name} is missing")
        assert kind == expected["kind"], f"td.distribute.{name} is a {kind}, TensorFlow's is a {expected['kind']}"
        if kind == "method":
            assert signature == expected["signature"], f"td.distribute.{name}{signature} != tf {expected['signature']}"
        return
    try:
        obj = _lookup(name)
    except AttributeError:
        pytest.fail(f"td.{name} is missing")
    kind = _kind(obj)
    assert kind == expected["kind"], f"td.{name} is a {kind}, TensorFlow's is a {expected['kind']}"
    if kind == "enum":
        members = {m.name: repr(m.value) for m in obj}
        assert members == expected["members"], f"td.{name} members {members} != tf {expected['members']}"
    elif kind in ("class", "function") and name not in NOT_CONSTRUCTED:
        wanted = DOCUMENTED_SIGNATURES.get(name, expected["signature"])
        assert dump_tf_api.signature(obj) == wanted, f"td.{name}{dump_tf_api.signature(obj)} != tf {wanted}"


def _cases() -> list[Any]:
    cases = []
    for name in sorted(PROMISED):
        if name in EXCLUDED:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=f"PENDING: {PENDING[name]}")] if name in PENDING else []
        cases.append(pytest.param(name, id=name, marks=marks))
    return cases


@pytest.mark.parametrize("name", _cases())
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the promise includes old names
def test_promised_name_exists_with_the_same_signature(name):
    _check(name, PROMISED[name])


def test_the_promise_covers_tensorflow_2_21():
    # Guards against an empty or truncated name list passing vacuously.
    assert API["tensorflow"].startswith("2.21")
    names = API["names"]
    assert len(names) > 80
    for required in ("distribute.MirroredStrategy", "Strategy.run", "StrategyExtended.reduce_to", "ReplicaContext.merge_call"):
        assert required in names
    assert names["Strategy.run"]["signature"] == "(fn, args=(), kwargs=None, options=None)"


def test_every_exclusion_and_pending_name_is_a_tensorflow_name_with_a_reason():
    for table in (EXCLUDED, PENDING, DOCUMENTED_SIGNATURES, NOT_CONSTRUCTED):
        for name, reason in table.items():
            assert name in PROMISED, f"{name} is not a promised TensorFlow name; remove it"
            assert reason.strip()
    assert not set(EXCLUDED) & set(PENDING)


def test_excluded_names_are_really_absent():
    # An excluded name that towerdist gains must move into the promise.
    for name in EXCLUDED:
        head, _, member = name.partition(".")
        if head in ("Strategy", "StrategyExtended", "ReplicaContext"):
            assert not hasattr(getattr(td.distribute, head), member), name
        else:
            with pytest.raises(AttributeError):
                _lookup(name)


def test_a_changed_signature_is_detected():
    # The comparison itself must be able to fail.
    expected = dict(API["names"]["Strategy.run"], signature="(fn, args=(), kwargs=None)")
    with pytest.raises(AssertionError, match="Strategy.run"):
        _check("Strategy.run", expected)
    with pytest.raises(pytest.fail.Exception, match="missing"):
        _check("distribute.NoSuchStrategy", {"kind": "class", "signature": "()"})
