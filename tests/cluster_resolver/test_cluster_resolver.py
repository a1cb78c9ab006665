"""``td.distribute.cluster_resolver`` and ``td.train.ClusterSpec``.

Expected values are literals observed in TensorFlow 2.21 (TensorFlow is not imported).
The tests marked ``multi_worker`` run in the default suite (one worker) and again under
``mpiexec -n 2 python -m pytest -m multi_worker`` (two workers), where they check a given
resolver against the MPI job.
"""

from __future__ import annotations

import json

import pytest

import towerdist as td

cr = td.distribute.cluster_resolver
ClusterSpec = td.train.ClusterSpec

FULL_TF_CONFIG = {
    "cluster": {"worker": ["a:1", "b:2"]},
    "task": {"type": "worker", "index": 1},
    "rpc_layer": "grpc",
    "environment": "cloud",
}


@pytest.fixture
def tf_config(monkeypatch):
    """Sets TF_CONFIG (a dict is written as JSON) for one test."""

    def set_config(value):
        monkeypatch.setenv("TF_CONFIG", value if isinstance(value, str) else json.dumps(value))

    monkeypatch.delenv("TF_CONFIG", raising=False)
    return set_config


# --- ClusterSpec ---------------------------------------------------------------------------------


@pytest.fixture
def spec():
    return ClusterSpec({"worker": ["h0:1", "h1:2"], "ps": ["p:3"]})


def test_cluster_spec_queries(spec):
    # Observed in TensorFlow 2.21 for this spec.
    assert spec.jobs == ["worker", "ps"]
    assert spec.as_dict() == {"worker": ["h0:1", "h1:2"], "ps": ["p:3"]}
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [0, 1]
    assert spec.task_address("worker", 1) == "h1:2"
    assert spec.job_tasks("worker") == ["h0:1", "h1:2"]
    assert repr(spec) == "ClusterSpec({'ps': ['p:3'], 'worker': ['h0:1', 'h1:2']})"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.num_tasks("nope"), "No such job in cluster: 'nope'"),
        (lambda s: s.task_indices("nope"), "No such job in cluster: 'nope'"),
        (lambda s: s.job_tasks("nope"), "No such job in cluster: 'nope'"),
        (lambda s: s.task_address("nope", 0), "No such job in cluster: 'nope'"),
        (lambda s: s.task_address("worker", 5), "No task with index 5 in job 'worker'"),
    ],
    ids=["num_tasks", "task_indices", "job_tasks", "task_address_job", "task_address_index"],
)
def test_cluster_spec_lookups_of_missing_jobs_and_tasks_raise_value_error(spec, call, message):
    # Observed in TensorFlow 2.21: ValueError with these first words.
    with pytest.raises(ValueError, match=message):
        call(spec)


def test_cluster_spec_equality_truth_and_hash(spec):
    # Observed in TensorFlow 2.21: equal regardless of job order, unequal to a dict, unhashable.
    assert spec == ClusterSpec({"ps": ["p:3"], "worker": ["h0:1", "h1:2"]})
    assert spec != ClusterSpec({})
    assert spec != {"worker": ["h0:1", "h1:2"], "ps": ["p:3"]}
    assert bool(spec) and not bool(ClusterSpec({}))
    assert bool(ClusterSpec({"worker": []}))
    with pytest.raises(TypeError, match="unhashable"):
        hash(spec)


def test_cluster_spec_from_cluster_spec_and_cluster_def(spec):
    # Observed in TensorFlow 2.21: a copy (and a ClusterDef round trip) sorts the jobs by name.
    assert ClusterSpec(spec).as_dict() == {"ps": ["p:3"], "worker": ["h0:1", "h1:2"]}
    assert ClusterSpec(spec).jobs == ["ps", "worker"]
    cluster_def = spec.as_cluster_def()
    assert [job.name for job in cluster_def.job] == ["ps", "worker"]
    assert cluster_def.job[1].tasks == {0: "h0:1", 1: "h1:2"}
    assert ClusterSpec(cluster_def) == spec


def test_cluster_spec_sparse_tasks():
    # Observed in TensorFlow 2.21 for {"worker": {1: "a:1", 3: "b:2"}}.
    sparse = ClusterSpec({"worker": {1: "a:1", 3: "b:2"}})
    assert sparse.as_dict() == {"worker": {1: "a:1", 3: "b:2"}}
    assert sparse.task_indices("worker") == [1, 3]
    assert sparse.num_tasks("worker") == 2
    assert sparse.job_tasks("worker") == [None, "a:1", None, "b:2"]
    with pytest.raises(ValueError, match="No task with index 0 in job 'worker'"):
        sparse.task_address("worker", 0)


def test_cluster_spec_accepts_tuples_and_string_indices():
    assert ClusterSpec({"worker": ("a:1", "b:2")}).as_dict() == {"worker": ["a:1", "b:2"]}
    assert ClusterSpec({"worker": {"2": "a:1"}}).task_indices("worker") == [2]


def test_cluster_spec_empty_job():
    # Observed in TensorFlow 2.21: {"worker": []} keeps the job; as_dict gives {} for it.
    empty = ClusterSpec({"worker": []})
    assert empty.jobs == ["worker"] and empty.as_dict() == {"worker": {}}


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        (["a"], "td.train.ClusterSpec"),
        (None, "td.train.ClusterSpec"),
        ({"worker": "a:1"}, "The tasks for job 'worker' must be a list or a dictionary"),
        ({"worker": 5}, "The tasks for job 'worker' must be a list or a dictionary"),
        ({1: ["a"]}, "Job name 1 must be a string"),
        ({"worker": [1]}, "Task address 1 must be a string"),
    ],
    ids=["list", "None", "string_tasks", "int_tasks", "int_job", "int_address"],
)
def test_cluster_spec_rejects_bad_clusters_with_type_error(cluster, message):
    # Observed in TensorFlow 2.21: TypeError for each of these.
    with pytest.raises(TypeError, match=message):
        ClusterSpec(cluster)


# --- ClusterResolver and SimpleClusterResolver ----------------------------------------------------


def test_cluster_resolver_is_abstract():
    # Observed in TensorFlow 2.21: TypeError "Can't instantiate abstract class ClusterResolver ...".
    with pytest.raises(TypeError, match="abstract"):
        cr.ClusterResolver()


def test_a_minimal_subclass_gets_the_defaults():
    class Resolver(cr.ClusterResolver):
        def cluster_spec(self):
            return ClusterSpec({"worker": ["a:1"]})

        def master(self, task_type=None, task_id=None, rpc_layer=None):
            return ""

    resolver = Resolver()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == (None, None, None, "")
    resolver.task_type, resolver.task_id = "worker", 0
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.num_accelerators() == {}  # no GPUs here


def test_simple_cluster_resolver():
    # Observed in TensorFlow 2.21 with these arguments.
    spec = ClusterSpec({"worker": ["a:1", "b:2"]})
    resolver = cr.SimpleClusterResolver(
        spec, master="m:0", task_type="worker", task_id=1, rpc_layer="grpc", num_accelerators={"GPU": 2}
    )
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == ("worker", 1, "grpc", "")
    assert resolver.master() == "grpc://m:0"
    assert resolver.master("worker", 0) == "grpc://a:1"
    assert resolver.master(rpc_layer="x") == "x://m:0"
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.cluster_spec() is spec
    assert isinstance(resolver, cr.ClusterResolver)


def test_simple_cluster_resolver_defaults():
    # Observed in TensorFlow 2.21: (None, None, None, '', '', {}).
    resolver = cr.SimpleClusterResolver(ClusterSpec({}))
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == (None, None, None, "")
    assert resolver.master() == "" and resolver.num_accelerators() == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cluster_spec": {"worker": ["a"]}}, "cluster_spec must be a `tf.train.ClusterSpec`"),
        ({"cluster_spec": ClusterSpec({}), "master": 1}, "master must be a string"),
    ],
    ids=["dict_spec", "int_master"],
)
def test_simple_cluster_resolver_type_errors(kwargs, message):
    # Observed in TensorFlow 2.21: TypeError with these first words.
    with pytest.raises(TypeError, match=message):
        cr.SimpleClusterResolver(**kwargs)


# --- UnionResolver ---------------------------------------------------------------------------------


def _simple(cluster, **kwargs):
    return cr.SimpleClusterResolver(ClusterSpec(cluster), **kwargs)


def test_union_resolver_merges_clusters_and_takes_the_first_resolvers_task():
    # Observed in TensorFlow 2.21 for these two resolvers.
    first = _simple(
        {"worker": ["a:1", "b:2"]}, master="m:0", task_type="worker", task_id=1, rpc_layer="grpc",
        num_accelerators={"GPU": 2},
    )  # fmt: skip
    union = cr.UnionResolver(first, _simple({"worker": ["c:3"], "ps": ["p:1"]}, task_type="ps", task_id=0))
    assert (union.task_type, union.task_id, union.rpc_layer, union.environment) == ("worker", 1, "grpc", "")
    assert union.master() == "grpc://m:0"
    assert union.cluster_spec() == ClusterSpec({"ps": ["p:1"], "worker": ["a:1", "b:2", "c:3"]})
    assert union.num_accelerators() == {"GPU": 2}
    assert union.master("worker", 2) == "c:3"


def test_union_resolver_overrides():
    union = cr.UnionResolver(_simple({"worker": ["a:1"]}, task_type="worker", task_id=1), task_type="chief", task_id=0)
    # TensorFlow 2.21 ignores a task_id override of 0 (it writes `override or first`); towerdist keeps it.
    assert (union.task_type, union.task_id) == ("chief", 0)
    union.rpc_layer = "grpc"
    assert union.rpc_layer == "grpc"


def test_union_resolver_merges_sparse_jobs_by_index():
    # Observed in TensorFlow 2.21: a list and a sparse dict merge into {0: 'a', 3: 'b'}.
    union = cr.UnionResolver(_simple({"worker": ["a"]}), _simple({"worker": {3: "b"}}))
    assert union.cluster_spec().as_dict() == {"worker": {0: "a", 3: "b"}}


def test_union_resolver_refuses_clashing_sparse_indices():
    union = cr.UnionResolver(_simple({"worker": {1: "a"}}), _simple({"worker": {1: "b"}}))
    with pytest.raises(KeyError, match="Duplicate keys detected when merging two ClusterSpecs"):
        union.cluster_spec()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((), {}, ValueError, "At least one ClusterResolver is required"),
        ((1,), {}, TypeError, "All arguments must be a sub-class of `ClusterResolver`"),
        (None, {"foo": 1}, ValueError, "Unexpected kwargs provided"),
    ],
    ids=["none", "not_a_resolver", "unknown_kwarg"],
)
def test_union_resolver_argument_errors(args, kwargs, error, message):
    # Observed in TensorFlow 2.21: these types and first words.
    args = (_simple({}),) if args is None else args
    with pytest.raises(error, match=message):
        cr.UnionResolver(*args, **kwargs)


# --- TFConfigClusterResolver ------------------------------------------------------------------------


def test_without_tf_config(tf_config):
    # Observed in TensorFlow 2.21 with TF_CONFIG unset (and with "{}").
    resolver = cr.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == (None, None, None, None)
    assert resolver.cluster_spec() == ClusterSpec({})
    assert resolver.master() == resolver.master("worker", 1) == ""
    assert resolver.num_accelerators() == {}


def test_with_an_empty_tf_config_object(tf_config):
    tf_config({})
    resolver = cr.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.cluster_spec()) == (None, None, ClusterSpec({}))


def test_with_a_full_tf_config(tf_config):
    # Observed in TensorFlow 2.21: environment is not read from TF_CONFIG (None).
    tf_config(FULL_TF_CONFIG)
    resolver = cr.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == (
        "worker",
        1,
        "grpc",
        None,
    )
    assert resolver.cluster_spec() == ClusterSpec({"worker": ["a:1", "b:2"]})
    assert resolver.master() == resolver.master("worker", 1) == resolver.master("worker", 1, "grpc") == "grpc://b:2"


def test_tf_config_is_read_at_every_call(tf_config):
    resolver = cr.TFConfigClusterResolver()
    assert resolver.task_id is None
    tf_config(FULL_TF_CONFIG)
    assert resolver.task_id == 1


def test_a_single_task_cluster_has_no_master_and_a_string_index_is_an_int(tf_config):
    # Observed in TensorFlow 2.21: task_id 0 from "index": "0", master ''.
    tf_config({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})
    resolver = cr.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.master()) == ("worker", 0, None, "")


def test_session_master_wins(tf_config):
    # Observed in TensorFlow 2.21: "session_master" is returned by every master() call.
    tf_config(
        {
            "cluster": {"chief": ["c:0"], "worker": ["a:1", "b:2"]},
            "task": {"type": "worker", "index": 0},
            "session_master": "sm:1",
        }
    )
    resolver = cr.TFConfigClusterResolver()
    assert resolver.master() == resolver.master("worker", 1, "grpc") == "sm:1"
    assert resolver.cluster_spec().jobs == ["chief", "worker"]


def test_master_without_rpc_layer_is_the_address(tf_config):
    # Observed in TensorFlow 2.21: 'b:2'.
    tf_config({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    assert cr.TFConfigClusterResolver().master() == "b:2"


def test_master_of_a_cluster_without_a_task_names_what_is_missing(tf_config):
    tf_config({"cluster": {"worker": ["a:1", "b:2"]}})
    with pytest.raises(ValueError, match=r"TFConfigClusterResolver.master\(\) needs a task"):
        cr.TFConfigClusterResolver().master()


def test_overrides_and_setters(tf_config):
    # Observed in TensorFlow 2.21: ('chief', 3, 'x', 'google'); setting None reads TF_CONFIG again.
    tf_config({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    resolver = cr.TFConfigClusterResolver(task_type="chief", task_id="3", rpc_layer="x", environment="google")
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == (
        "chief",
        3,
        "x",
        "google",
    )
    resolver.task_type = resolver.task_id = resolver.rpc_layer = None
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, None)


@pytest.mark.parametrize("text", ["", "not json"], ids=["empty", "garbage"])
def test_tf_config_that_is_not_json_raises_a_json_decode_error(tf_config, text):
    # Observed in TensorFlow 2.21: json.JSONDecodeError (a ValueError) from every reader.
    tf_config(text)
    resolver = cr.TFConfigClusterResolver()
    with pytest.raises(json.JSONDecodeError, match="TF_CONFIG"):
        resolver.cluster_spec()
    with pytest.raises(ValueError, match="TF_CONFIG"):
        _ = resolver.task_type


def test_tf_config_that_is_not_an_object_raises(tf_config):
    tf_config("[1, 2]")
    with pytest.raises(ValueError, match="TF_CONFIG must hold a JSON object"):
        cr.TFConfigClusterResolver().cluster_spec()


# --- MPIClusterResolver (single process) ------------------------------------------------------------


def test_mpi_cluster_resolver_of_given_rank_and_size():
    resolver = cr.MPIClusterResolver(1, 3)
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == ("worker", 1, None, "")
    assert resolver.cluster_spec().as_dict() == {"worker": ["mpi-rank-0", "mpi-rank-1", "mpi-rank-2"]}
    assert resolver.master() == ""
    assert repr(resolver) == "MPIClusterResolver(task_type='worker', task_id=1, num_workers=3)"


def test_mpi_cluster_resolver_refuses_a_rank_outside_the_job():
    with pytest.raises(ValueError, match="MPIClusterResolver needs 0 <= rank < size"):
        cr.MPIClusterResolver(2, 2)


def test_strategies_without_a_cluster_have_no_resolver(mirrored_strategy):
    assert mirrored_strategy.cluster_resolver is None


# --- MultiWorkerMirroredStrategy and a given resolver (one worker here, two under mpiexec -n 2) -------


def _rank_and_size():
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    return strategy.extended._worker_index, strategy.extended._num_workers


@pytest.mark.multi_worker
def test_the_default_resolver_is_mpis():
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    rank, size = strategy.extended._worker_index, strategy.extended._num_workers
    resolver = strategy.cluster_resolver
    assert isinstance(resolver, cr.MPIClusterResolver)
    assert (resolver.task_type, resolver.task_id) == ("worker", rank)
    assert resolver.cluster_spec().num_tasks("worker") == size
    assert isinstance(cr.MPIClusterResolver(), cr.ClusterResolver)
    assert cr.MPIClusterResolver().task_id == rank


@pytest.mark.multi_worker
def test_a_tf_config_resolver_that_matches_mpi_is_used(tf_config):
    rank, size = _rank_and_size()
    tf_config(
        {"cluster": {"worker": [f"host{i}:2222" for i in range(size)]}, "task": {"type": "worker", "index": rank}}
    )
    resolver = cr.TFConfigClusterResolver()
    strategy = td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert strategy.cluster_resolver is resolver
    assert strategy.extended._num_workers == size


@pytest.mark.multi_worker
def test_a_chief_counts_as_worker_zero(tf_config):
    rank, size = _rank_and_size()
    cluster = {"chief": ["chief:2222"], "worker": [f"host{i}:2222" for i in range(size - 1)]}
    task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
    tf_config({"cluster": cluster, "task": task})
    resolver = cr.TFConfigClusterResolver()
    assert td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver).cluster_resolver is resolver


@pytest.mark.multi_worker
def test_a_resolver_with_an_empty_cluster_gives_the_mpi_resolver(tf_config):
    rank, _ = _rank_and_size()
    strategy = td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cr.TFConfigClusterResolver())
    assert isinstance(strategy.cluster_resolver, cr.MPIClusterResolver)
    assert strategy.cluster_resolver.task_id == rank


@pytest.mark.multi_worker
def test_a_resolver_with_another_number_of_workers_is_refused(tf_config):
    _, size = _rank_and_size()
    tf_config({"cluster": {"worker": [f"h{i}:1" for i in range(size + 1)]}, "task": {"type": "worker", "index": 0}})
    with pytest.raises(ValueError, match=f"which has {size + 1} workers, but MPI started this process as rank"):
        td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cr.TFConfigClusterResolver())


@pytest.mark.multi_worker
def test_a_resolver_that_places_this_process_elsewhere_is_refused(tf_config):
    rank, size = _rank_and_size()
    cluster = {"worker": [f"h{i}:1" for i in range(size)]}
    resolver = cr.SimpleClusterResolver(ClusterSpec(cluster), task_type="worker", task_id=(rank + 1) % (size + 1))
    with pytest.raises(ValueError, match="which makes this process (worker|no worker).*MPI started this process"):
        td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


@pytest.mark.multi_worker
def test_a_resolver_with_parameter_servers_is_refused(tf_config):
    rank, size = _rank_and_size()
    cluster = {"worker": [f"h{i}:1" for i in range(size)], "ps": ["p:1"]}
    resolver = cr.SimpleClusterResolver(ClusterSpec(cluster), task_type="worker", task_id=rank)
    with pytest.raises(ValueError, match=r"whose jobs \['ps'\] are not workers"):
        td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


@pytest.mark.multi_worker
def test_an_evaluator_job_is_ignored_but_an_evaluator_task_is_refused(tf_config):
    rank, size = _rank_and_size()
    cluster = {"worker": [f"h{i}:1" for i in range(size)], "evaluator": ["e:1"]}
    ok = cr.SimpleClusterResolver(ClusterSpec(cluster), task_type="worker", task_id=rank)
    assert td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=ok).cluster_resolver is ok
    evaluator = cr.SimpleClusterResolver(ClusterSpec(cluster), task_type="evaluator", task_id=0)
    with pytest.raises(ValueError, match="which makes this process no worker"):
        td.distribute.MultiWorkerMirroredStrategy(cluster_resolver=evaluator)
