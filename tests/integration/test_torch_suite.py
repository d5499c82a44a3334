"""A fast slice of torch's own distributed test suite: every test gloo passes passes over hccl.

The full comparison is ``python -m tests.torch_suite.run_distributed_suite --backend hccl``
(1-2 minutes per backend on 2 cores); this runs a few tests of each subset, gloo first
as the reference, 2 ranks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.torch_suite.run_distributed_suite import differences, run_backend

# one or more per subset: collectives, ddp, comm_hooks, subgroups (names from torch 2.13)
FAST = [
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_all_reduce_coalesced_sum",  # gated to gloo by torch: runs ungated on hccl
    "test_broadcast",  # float64 tensors
    "test_all_gather_coalesced_simple",
    "test_reduce_sum",
    "test_barrier",
    "test_send_recv",
    "test_send_recv_any_source",
    "test_irecv",
    "test_batch_isend_irecv_gloo",  # irecv before isend on both ranks
    "test_gather",
    "test_scatter",
    "test_DistributedDataParallelCPU",
    "test_ddp_logging_data_cpu",
    "test_get_future",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_new_subgroups",
    "test_destroy_group",
]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fast_slice_of_torch_suite_passes_on_hccl_where_gloo_passes(tmp_path):
    """Each test of the slice that passes on gloo passes on hccl (2 ranks).

    The two backends' runs are independent (a worker process each, their own temporary
    folders and logs) and mostly wait (torch's harness polls its ranks and file barriers every
    0.1 s), so they run side by side."""
    def run(backend: str):
        return run_backend(backend, FAST, world_size=2, per_test_timeout_s=60, total_timeout_s=100,
                           log_dir=str(tmp_path))

    with ThreadPoolExecutor(max_workers=2) as pool:
        gloo_run, hccl_run = pool.submit(run, "gloo"), pool.submit(run, "hccl")
        gloo, hccl = gloo_run.result(), hccl_run.result()
    passed_on_gloo = [n for n in FAST if gloo.outcome(n) == "passed"]
    assert len(passed_on_gloo) >= 12, f"the gloo reference ran too little: {gloo.results} (log {gloo.log})"
    broken = [(n, hccl.outcome(n), msg) for n, a, b, msg in differences(gloo, hccl) if n in passed_on_gloo]
    assert not broken, f"gloo passes, hccl does not (log {hccl.log}):\n" + "\n".join(map(str, broken))
