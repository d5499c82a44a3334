"""The kernels of ``torch.nn.SyncBatchNorm`` for hpu tensors.

NOTE [SyncBatchNorm's kernels]
``SyncBatchNorm`` (torchvision's reference scripts' ``--sync-bn``) calls five aten ops that
torch implements for CUDA only: ``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``,
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``.
Habana's bridge has HPU kernels for all five (HabanaAI/gaudi-pytorch-bridge
``habana_kernels/kernels_register.cpp``, ``scripts/ops_list/ops.hpu``); an hpu tensor here runs
torch's CPU kernels, which do not exist for them, so the job failed with ``NotImplementedError``
at the first forward. :func:`install` registers each for the ``HPU`` dispatch key, written with
torch ops in the statistics' accumulate dtype (float32 for bf16/fp16/fp32 input, float64 for
float64), by the same formulas as torch's CUDA kernels (``aten/src/ATen/native/cuda/Normalization.cuh``):
per-channel mean and ``1 / sqrt(biased var + eps)``; the ranks' statistics combined by their
counts, the running variance updated unbiased; the backward's per-channel sums and the input
gradient from the all-reduced sums. The bridge charges each as one op (its inner ops are not
seen: :func:`~hpu_runtime.bridge.dispatch.charged_as_one_op`).

Tested against ``BatchNorm`` of the whole batch in one process (forward, running statistics,
input and parameter gradients).
"""

from __future__ import annotations

import torch

__all__ = ["install"]

_lib: torch.library.Library | None = None


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _dims(x: torch.Tensor) -> list[int]:
    """Every dimension but the channel (1)."""
    return [d for d in range(x.dim()) if d != 1]


def _per_channel(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``v`` (C,) shaped to broadcast over ``like`` (N, C, ...)."""
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def batch_norm_stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = input.to(_acc(input.dtype))
    var, mean = torch.var_mean(x, dim=_dims(x), correction=0)
    return mean, torch.rsqrt(var + eps)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum: float, eps: float,
                                        counts) -> tuple[torch.Tensor, torch.Tensor]:
    c = counts.to(mean.dtype).view(-1, 1)  # (world, 1)
    n = c.sum()
    g_mean = (c * mean).sum(0) / n
    var_i = 1.0 / (invstd * invstd) - eps  # each rank's biased variance
    g_var = (c * (var_i + (mean - g_mean) ** 2)).sum(0) / n
    if running_mean is not None:
        running_mean.copy_((1 - momentum) * running_mean + momentum * g_mean.to(running_mean.dtype))
    if running_var is not None:
        unbiased = g_var * n / (n - 1)
        running_var.copy_((1 - momentum) * running_var + momentum * unbiased.to(running_var.dtype))
    return g_mean, torch.rsqrt(g_var + eps)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps: float) -> torch.Tensor:
    acc = mean.dtype
    y = (input.to(acc) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        y = y * _per_channel(weight.to(acc), input)
    if bias is not None:
        y = y + _per_channel(bias.to(acc), input)
    return y.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g: bool, weight_g: bool,
                               bias_g: bool) -> tuple[torch.Tensor, ...]:
    acc = mean.dtype
    dy = grad_out.to(acc)
    dims = _dims(dy)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.to(acc) - _per_channel(mean, input))).sum(dims)
    out_dtype = weight.dtype if weight is not None else acc
    grad_weight = (sum_dy_xmu * invstd).to(out_dtype)
    grad_bias = sum_dy.to(out_dtype)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count) -> torch.Tensor:
    acc = mean.dtype
    n = count.to(acc).sum()
    mean_dy = sum_dy / n
    mean_dy_xmu = sum_dy_xmu / n
    scale = invstd if weight is None else invstd * weight.to(acc)
    xmu = input.to(acc) - _per_channel(mean, input)
    dx = (grad_out.to(acc) - _per_channel(mean_dy, input) - xmu * _per_channel(invstd * invstd * mean_dy_xmu, input))
    return (dx * _per_channel(scale, input)).to(input.dtype)


_KERNELS = (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
            batch_norm_backward_elemt)


def install() -> None:
    """Register the five kernels for the ``HPU`` key (once per process; NOTE [SyncBatchNorm's kernels])."""
    global _lib
    if _lib is not None:
        return
    from .dispatch import charged_as_one_op

    lib = torch.library.Library("aten", "IMPL")
    for fn in _KERNELS:
        lib.impl(fn.__name__, charged_as_one_op(getattr(torch.ops.aten, fn.__name__).default, fn), "HPU")
    _lib = lib
