"""The drop-in promise, tested: TensorFlow's tf.distribute names exist in towerdist with the same signatures.

``tests/project/tf_distribute_api.json`` is written by ``tools/dump_tf_api.py`` from the
installed TensorFlow (2.21): every public name of ``tf.distribute``,
``tf.distribute.experimental`` and ``tf.distribute.cluster_resolver``, the public members of
``Strategy``, ``StrategyExtended`` and ``ReplicaContext``, the ``StrategyExtended`` members
TF 2.x keeps in ``tf.compat.v1``, and the public members of the cluster resolvers,
``tf.train.ClusterSpec`` and ``tf.data.Dataset`` (named by path, e.g. ``data.Dataset.batch``).
``LEGACY`` adds the TF 2.0-2.3 names TF 2.21 no longer has.

Every promised name must exist in towerdist with the same kind (module, class, enum,
function, method, property) and, for callables, the same parameters (names, kinds and
default values; annotations are ignored). ``EXCLUDED`` lists what towerdist does not
provide because it needs TPUs, TensorFlow graphs or TensorFlow's gRPC cluster runtime,
or values numpy cannot represent (ragged and sparse tensors), each with its reason.
``PENDING`` lists promised names not built yet: their tests are
strict xfails, so building one forces its removal from the list.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import json
import pathlib
from typing import Any

import numpy as np
import pytest

import towerdist as td

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dump_tf_api", ROOT / "tools" / "dump_tf_api.py")
assert _spec is not None and _spec.loader is not None
dump_tf_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dump_tf_api)

API = json.loads((ROOT / "tests" / "project" / "tf_distribute_api.json").read_text())

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
    "distribute.cluster_resolver.TPUClusterResolver": _TPU,
    "distribute.cluster_resolver.GCEClusterResolver": (
        "asks Google Compute Engine's API (googleapiclient) for the addresses of an instance group's gRPC "
        "servers; towerdist's workers are the ranks of an MPI job (MPIClusterResolver)"
    ),
    "distribute.cluster_resolver.KubernetesClusterResolver": (
        "asks the Kubernetes API (the kubernetes client) for the addresses of pods running gRPC servers; "
        "towerdist's workers are the ranks of an MPI job (MPIClusterResolver)"
    ),
    "distribute.cluster_resolver.KubernetesExecutableLocation": "configures KubernetesClusterResolver, which is excluded",
    "distribute.cluster_resolver.SlurmClusterResolver": (
        "turns Slurm's node list into gRPC server addresses and ports; under Slurm start the workers with "
        "srun --mpi=pmi2 or mpiexec and MPIClusterResolver takes the ranks from MPI"
    ),
    "StrategyExtended.experimental_run_steps_on_iterator": (
        "TF 1.x graph-mode step loop (MultiStepContext) for Estimator and TPUs; needs graphs"
    ),
}


EXCLUDED.update(
    {
        "data.Dataset.fingerprint": (
            "returns the fingerprint of the dataset's TensorFlow graph; towerdist datasets are Python "
            "iterators with no graph to fingerprint"
        ),
        "data.Dataset.snapshot": (
            "persists a dataset in TensorFlow's snapshot format (also written by the tf.data service's "
            "distributed snapshots, read back through reader_func graphs); towerdist offers cache(filename) "
            "and save()/load() for keeping computed elements"
        ),
    }
)

_GRAPH = "a TensorFlow graph member (graph, operation, session or proto); towerdist is eager and has no graphs"

# tf.Variable and tf.IndexedSlices members towerdist does not provide: TF 1.x graph-mode API. (On
# td.IndexedSlices, reading op, graph or consumers raises an AttributeError that says so.)
EXCLUDED.update(
    {
        "Variable.SaveSliceInfo": "describes a partitioned variable's slice in a TF 1.x graph checkpoint (Saver); "
        + _GRAPH,
        "Variable.count_up_to": "TF 1.x graph op (deprecated: use Dataset.range); " + _GRAPH,
        "Variable.eval": "evaluates in a TF 1.x Session; " + _GRAPH + " (use numpy())",
        "Variable.from_proto": "builds a variable from a TF 1.x VariableDef proto; " + _GRAPH,
        "Variable.to_proto": "writes a TF 1.x VariableDef proto; " + _GRAPH,
        "Variable.graph": _GRAPH,
        "Variable.op": _GRAPH,
        "Variable.initializer": "the op that initialises the variable in a TF 1.x Session; " + _GRAPH,
        "Variable.initial_value": "the graph tensor of the initial value (TF 1.x); " + _GRAPH,
        "Variable.initialized_value": "TF 1.x (deprecated: variables are initialised when created); " + _GRAPH,
        "Variable.load": "loads a value through a TF 1.x Session (deprecated: use assign); " + _GRAPH,
        "Variable.set_shape": "refines a graph tensor's static shape; " + _GRAPH + " (shapes are always known)",
        "IndexedSlices.op": _GRAPH,
        "IndexedSlices.graph": _GRAPH,
        "IndexedSlices.consumers": _GRAPH,
    }
)

PENDING: dict[str, str] = {}

# Names whose TensorFlow signature is not the one users call: the documented call is promised instead.
DOCUMENTED_SIGNATURES = {
    # TF's range is (*args, **kwargs) in code, documented as range(*args, output_type=tf.int64, name=None);
    # towerdist's dtypes are numpy's.
    "data.Dataset.range": "(*args, output_type=<class 'numpy.int64'>, name=None)",
    # TF's default dtype is tf.int64; towerdist's dtypes are numpy's.
    "data.Dataset.counter": "(start=0, step=1, dtype=<class 'numpy.int64'>, name=None)",
    # Present with TF's signature, and refused with UnimplementedError: numpy has no ragged tensors.
    "data.Dataset.ragged_batch": "(batch_size, drop_remainder=False, row_splits_dtype=<class 'numpy.int64'>, name=None)",
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


_STRATEGY_OWNERS = ("Strategy", "StrategyExtended", "ReplicaContext")  # their members are keyed without a path


def _lookup(name: str) -> Any:
    """The towerdist object for a promised name, or raises AttributeError."""
    head, _, rest = name.partition(".")
    if head in _STRATEGY_OWNERS:
        owner: Any = getattr(td.distribute, head)
        return inspect.getattr_static(owner, rest) if rest else owner
    obj: Any = td
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _member(name: str, expected: dict[str, Any]) -> tuple[Any, str, str] | None:
    """``(owner class, member name, label)`` for a promised class member, else None."""
    head, _, member = name.partition(".")
    if head in _STRATEGY_OWNERS:
        return getattr(td.distribute, head), member, f"td.distribute.{name}"
    if expected["kind"] in ("method", "property"):
        owner_path, _, member = name.rpartition(".")
        return _lookup(owner_path), member, f"td.{name}"
    return None


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


def _member_kind_and_signature(cls: Any, member: str) -> tuple[str, str | None]:
    raw = inspect.getattr_static(cls, member)
    if isinstance(raw, property):
        return "property", None
    return "method", dump_tf_api.signature(getattr(cls, member))


def _check(name: str, expected: dict[str, Any]) -> None:
    try:
        found = _member(name, expected)
    except AttributeError:
        pytest.fail(f"td.{name.rpartition('.')[0]} (the owner of {name}) is missing")
    if found is not None:
        cls, member, label = found
        try:
            kind, signature = _member_kind_and_signature(cls, member)
        except AttributeError:
            pytest.fail(f"{label} is missing")
        assert kind == expected["kind"], f"{label} is a {kind}, TensorFlow's is a {expected['kind']}"
        if kind == "method":
            wanted = DOCUMENTED_SIGNATURES.get(name, expected["signature"])
            assert signature == wanted, f"{label}{signature} != tf {wanted}"
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
    assert len(names) > 180
    for required in (
        "distribute.MirroredStrategy",
        "Strategy.run",
        "StrategyExtended.reduce_to",
        "ReplicaContext.merge_call",
        "distribute.cluster_resolver.TFConfigClusterResolver",
        "distribute.cluster_resolver.ClusterResolver.master",
        "train.ClusterSpec.task_address",
        "data.Dataset.interleave",
        "data.Dataset.element_spec",
    ):
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
        if head in _STRATEGY_OWNERS:
            assert not hasattr(getattr(td.distribute, head), member), name
        else:
            with pytest.raises(AttributeError):
                _lookup(name)


@pytest.mark.parametrize("name", sorted(n for n in API["names"] if n.startswith("Variable.") and n not in EXCLUDED))
def test_distributed_variables_keep_the_promised_variable_members(name):
    # MirroredVariable and SyncOnReadVariable are what td.Variable returns in a strategy's scope: the
    # members promised on td.Variable must keep TensorFlow's kind and signature in every subclass.
    from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable
    from towerdist._src.variables.variable import ResourceVariable

    member = name.partition(".")[2]
    expected = API["names"][name]
    for cls in (ResourceVariable, MirroredVariable, SyncOnReadVariable):
        kind, signature = _member_kind_and_signature(cls, member)
        assert kind == expected["kind"], f"{cls.__name__}.{member} is a {kind}"
        if kind == "method":
            assert signature == expected["signature"], f"{cls.__name__}.{member}{signature} != tf {expected['signature']}"


def test_graph_members_of_indexed_slices_say_that_towerdist_is_eager():
    slices = td.IndexedSlices(np.ones(1, np.float32), np.array([0]))
    for member in ("op", "graph", "consumers"):
        with pytest.raises(AttributeError, match=f"IndexedSlices.{member} .*towerdist is eager"):
            getattr(slices, member)


def test_a_changed_signature_is_detected():
    # The comparison itself must be able to fail.
    expected = dict(API["names"]["Strategy.run"], signature="(fn, args=(), kwargs=None)")
    with pytest.raises(AssertionError, match="Strategy.run"):
        _check("Strategy.run", expected)
    with pytest.raises(pytest.fail.Exception, match="missing"):
        _check("distribute.NoSuchStrategy", {"kind": "class", "signature": "()"})
    with pytest.raises(AssertionError, match="data.Dataset.batch"):
        _check("data.Dataset.batch", {"kind": "method", "signature": "(batch_size)"})
    with pytest.raises(pytest.fail.Exception, match="td.data.Dataset.no_such_method is missing"):
        _check("data.Dataset.no_such_method", {"kind": "method", "signature": "()"})
    with pytest.raises(AssertionError, match="is a method, TensorFlow's is a property"):
        _check("train.ClusterSpec.as_dict", {"kind": "property"})
