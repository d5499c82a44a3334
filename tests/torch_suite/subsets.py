"""Which of torch's distributed tests the runner picks, by name (pure: no torch import).

The subset is a union of named groups of regular expressions over the test method names of
``DistributedTest._DistTestBase`` (torch 2.13: 292 tests). Names that can only run on a GPU
or with NCCL (``cuda``, ``nccl``, ``gpu``) are dropped before anything is spawned: on this
CPU machine they are skipped on every backend and each would still cost two process starts.
Tests that exercise torch features unrelated to the backend (profilers, SyncBatchNorm, model
averagers, torch.compile, device meshes) are dropped too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["SUBSETS", "EXCLUDE", "DEFAULT_SUBSETS", "select", "group_of"]

#: group name -> regular expressions (``re.search`` on the method name).
SUBSETS: dict[str, tuple[str, ...]] = {
    # every collective and point-to-point call, on the default group, a subgroup and the full group
    "collectives": (
        r"^test_(all_reduce|reduce|broadcast|all_gather|reduce_scatter|all_to_all|barrier)(_|$)",
        r"^test_(gather|scatter)(_|$)",
        r"^test_(send_recv|isend|irecv|batch_isend_irecv)(_|$)",
        r"^test_(all_gather_object|gather_object|broadcast_object_list|scatter_object_list)",
        r"^test_coalescing_manager",
    ),
    # DistributedDataParallel on CPU modules
    "ddp": (
        r"^test_DistributedDataParallel(CPU|CPU_grad_is_view|_requires_grad)?$",
        r"^test_ddp_(zero_output_features|create_graph|logging_data_cpu|bucket_cap_mb_list|sync_module_states)$",
        r"^test_ddp_(namedtuple|inference|returns_tensor_with_no_grad|new_tensor_in_fwd.*|static_graph_nested_types)$",
        r"^test_ddp_(ignore_params_arg|shared_grad_acc_unused_params|unused_params_rebuild_buckets_exception)$",
        r"^test_ddp_(uneven_inputs|uneven_input_join_disable|uneven_input_exception|grad_div_uneven_inputs)$",
        r"^test_ddp_(join_model_equivalence|broadcast_buffer|remove_autograd_hooks|device|sink_noclone)$",
        r"^test_(static_graph_api_cpu|static_graph_multi_forward|detect_ddp_is_actually_static|invalid_static_graph)$",
        r"^test_ddp_control_flow_(same|different)_across_ranks$",
        r"^test_(verify_model_across_rank_.*|ddp_model_diff_.*|output_unused_in_loss_.*|different_graph_across_ranks)$",
        r"^test_(undefined_grad_parity_unused_parameters|skip_all_reduce_unused_parameters|grads_same_across_ranks_with_no_sync)$",
        r"^test_ddp_(multiple_nested_unused_params_.*|build_debug_param_to_name_mapping.*|python_error_logged|forward_backward_hook)$",
        r"^test_(ddp_apply_optim_in_backward.*|get_data_parallel_params|stateless_api_with_ddp)$",
    ),
    # DDP communication hooks (allreduce, PowerSGD, post-local SGD, futures, buffer hooks)
    "comm_hooks": (
        r"^test_ddp_hook_(parity_allreduce|parity_allreduce_process_group|parity_powerSGD|parity_post_localSGD)$",
        r"^test_ddp_hook_(with_optimizer_parity_.*|pickling_powerSGD)$",
        r"^test_ddp_comm_hook_logging$",
        r"^test_accumulate_gradients_no_sync.*",
        r"^test_get_future$",
        r"^test_ddp_(buffer_hook_allreduce.*|broadcast_buffer_via_hook)$",
        r"^test_post_localSGD_optimizer_(parity|parity_grad_is_view|step_reload)$",
    ),
    # new_group / new_subgroups and DDP on a changed group
    "subgroups": (
        r"^test_new_subgroups",
        r"^test_(destroy_group|destroy_full_group|get_rank_size_group|get_rank_size_full_group)$",
        r"^test_ddp_update_process_group_.*",
        r"^test_(get_rank|get_backend|Backend_enum_class)$",
    ),
}

#: dropped from every group (see the module docstring).
EXCLUDE: tuple[str, ...] = (
    r"cuda", r"nccl", r"gpu", r"_complex_unsupported",
    r"profiler", r"profiling", r"SyncBatchNorm", r"sync_bn", r"model_averager", r"hierarchical",
    r"amp", r"compile", r"device_mesh", r"monitored_barrier", r"barrier_timeout", r"execution_trace",
    r"mixed_backend",
)

DEFAULT_SUBSETS: tuple[str, ...] = tuple(SUBSETS)


def select(names: Iterable[str], subsets: Iterable[str] = DEFAULT_SUBSETS, pattern: str | None = None) -> list[str]:
    """The sorted test names in any of ``subsets`` (and matching ``pattern``, a regular
    expression or a plain substring, when given), less :data:`EXCLUDE`.

    Raises:
        ValueError: an unknown subset name.
    """
    unknown = [s for s in subsets if s not in SUBSETS]
    if unknown:
        raise ValueError(f"unknown subset(s) {unknown}; choose from {sorted(SUBSETS)}")
    wanted = [re.compile(p) for s in subsets for p in SUBSETS[s]]
    dropped = [re.compile(p) for p in EXCLUDE]
    chosen = set()
    for name in names:
        if not any(r.search(name) for r in wanted) or any(r.search(name) for r in dropped):
            continue
        if pattern and pattern not in name and not re.search(pattern, name):
            continue
        chosen.add(name)
    return sorted(chosen)


def group_of(name: str, subsets: Iterable[str] = DEFAULT_SUBSETS) -> str:
    """The first of ``subsets`` whose expressions match ``name`` ("other" if none does)."""
    for s in subsets:
        if any(re.search(p, name) for p in SUBSETS[s]):
            return s
    return "other"
