"""Choosing torch's distributed tests by name (tests/torch_suite/subsets.py): pure, fast."""

from __future__ import annotations

import pytest

from tests.torch_suite.subsets import group_of, select

NAMES = [
    "test_all_reduce_sum", "test_all_reduce_sum_cuda", "test_broadcast_group", "test_send_recv_any_source",
    "test_DistributedDataParallelCPU", "test_DistributedDataParallel_SyncBatchNorm", "test_get_future",
    "test_new_subgroups", "test_ddp_profiling_torch_profiler", "test_dump_DDP_relevant_env_vars",
]


def test_select_takes_every_group_less_gpu_and_unrelated_tests() -> None:
    """The default subset keeps CPU collectives, DDP, hooks and subgroups; drops cuda/profiler/SyncBatchNorm."""
    assert select(NAMES) == [
        "test_DistributedDataParallelCPU", "test_all_reduce_sum", "test_broadcast_group", "test_get_future",
        "test_new_subgroups", "test_send_recv_any_source",
    ]


def test_select_by_group_and_pattern() -> None:
    """-k is a substring or a regular expression, applied within the chosen groups."""
    assert select(NAMES, ["collectives"], "all_reduce|any_source") == ["test_all_reduce_sum", "test_send_recv_any_source"]
    assert select(NAMES, ["comm_hooks"]) == ["test_get_future"]
    assert group_of("test_new_subgroups") == "subgroups" and group_of("test_dump_DDP_relevant_env_vars") == "other"


def test_unknown_group_is_named() -> None:
    with pytest.raises(ValueError, match="nope"):
        select(NAMES, ["nope"])
