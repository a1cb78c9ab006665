import towerdist as td


def test_mirrored_run_merges_distinct_results_into_per_replica(mirrored_2cpu):
    result = mirrored_2cpu.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert isinstance(result, td.distribute.PerReplica)
    assert [int(v) for v in result.values] == [0, 1]
