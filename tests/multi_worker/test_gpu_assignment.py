"""Which GPUs each worker of a host uses (``multi_worker/gpu_assignment.py``), and the NCCL unique id's form."""

from __future__ import annotations

import pytest

from towerdist._src.multi_worker import gpu_assignment
from towerdist._src.multi_worker.nccl_workers import shared_unique_id


@pytest.mark.parametrize(
    "local_rank, expected", [(0, (0,)), (1, (1,))], ids=["local rank 0", "local rank 1"]
)
def test_workers_seeing_the_same_gpus_split_them_by_local_rank(local_rank, expected):
    # N2: every worker used every GPU, so both ranks of `mpiexec -n 2` put their NCCL rank on GPU 0.
    assert gpu_assignment.assign_gpus(local_rank, [["0", "1"], ["0", "1"]]) == expected


def test_the_split_is_in_contiguous_blocks_and_leaves_the_remainder_unused():
    everyone = [["0", "1", "2", "3", "4"]] * 2
    assert [gpu_assignment.assign_gpus(r, everyone) for r in (0, 1)] == [(0, 1), (2, 3)]


def test_workers_given_their_own_gpus_keep_all_of_them():
    # CUDA_VISIBLE_DEVICES set per rank (TensorFlow's way): each worker uses what it sees.
    everyone = [["GPU-aa", "GPU-bb"], ["GPU-cc"]]
    assert gpu_assignment.assign_gpus(0, everyone) == (0, 1)
    assert gpu_assignment.assign_gpus(1, everyone) == (0,)


def test_one_worker_keeps_every_gpu():
    assert gpu_assignment.assign_gpus(0, [["0", "1", "2"]]) == (0, 1, 2)


def test_fewer_gpus_than_workers_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"3 workers run on host .* which has 2 visible GPU\(s\) \(0, 1\); NCCL needs"):
        gpu_assignment.assign_gpus(2, [["0", "1"]] * 3)


def test_overlapping_gpu_sets_are_refused_naming_the_shared_gpus():
    with pytest.raises(ValueError, match=r"local rank 0: 0, 1; local rank 1: 1, 2\); GPU\(s\) 1 would be used by two"):
        gpu_assignment.assign_gpus(0, [["0", "1"], ["1", "2"]])


def test_visible_gpu_names_come_from_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    assert gpu_assignment.visible_gpu_names(2) == ["3", "1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_assignment.visible_gpu_names(2) == ["0", "1"]


class _OneWorker:
    rank = 0

    def broadcast_bytes(self, data: bytes, api: str) -> bytes:
        return data


class _Nccl:
    def __init__(self, made):
        self._made = made

    def get_unique_id(self):
        return self._made


@pytest.mark.parametrize(
    "made", [bytes(range(120, 248)), tuple(b - 256 if b > 127 else b for b in range(120, 248))], ids=["cupy 14 bytes", "cupy 13 tuple"]
)
def test_the_unique_id_reaches_every_worker_in_the_form_cupy_gave_it(made):
    # N1: the id was passed as tuple(list(uid)); cupy 14 returns and takes bytes only.
    received = shared_unique_id(_OneWorker(), _Nccl(made), "test")
    assert type(received) is type(made) and received == made


def test_gpus_are_named_by_their_pci_address_where_cuda_tells_it():
    # Processes isolated to one GPU each (a container per rank) all see it as index 0: the
    # PCI address tells them apart, so each keeps its own instead of being refused.
    buses = {0: 0x3B, 1: 0x5E}

    def properties(index):
        return {"pciDomainID": 0, "pciBusID": buses[index], "pciDeviceID": 0}

    assert gpu_assignment.visible_gpu_names(2, properties) == ["pci:0000:3b:00", "pci:0000:5e:00"]
    assert gpu_assignment.assign_gpus(1, [["pci:0000:3b:00"], ["pci:0000:5e:00"]]) == (0,)


def test_without_pci_addresses_the_environment_names_the_gpus(monkeypatch):
    def no_properties(index):
        raise AttributeError("getDeviceProperties")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_assignment.visible_gpu_names(2, no_properties) == ["0", "1"]
