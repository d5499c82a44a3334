"""The transport's share of the cores (NOTE [the transport's threads] in hccl/transport/reduce_ops.py)."""

from __future__ import annotations

import os

import pytest

from hccl.transport.reduce_ops import transport_threads


def test_the_cores_of_the_affinity_are_shared_among_the_local_ranks():
    cores = len(os.sched_getaffinity(0))
    assert transport_threads(1) == cores
    assert transport_threads(cores) == 1
    assert transport_threads(2 * cores) == 1  # more ranks than cores: still one thread each
    if cores >= 4:
        assert transport_threads(2) == cores // 2


def test_an_affinity_of_one_core_gives_one_thread(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert transport_threads(1) == 1


@pytest.mark.parametrize("bad", [0, -2])
def test_no_local_ranks_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="local_ranks must be at least 1"):
        transport_threads(bad)


def test_capped_threads_lowers_never_raises_and_restores_on_error():
    import torch

    from hccl.transport.reduce_ops import capped_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with capped_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
        with capped_threads(8):  # a share above the user's own setting leaves it alone
            assert torch.get_num_threads() == 3
        with pytest.raises(RuntimeError, match="boom"):
            with capped_threads(2):
                assert torch.get_num_threads() == 2
                raise RuntimeError("boom")
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
