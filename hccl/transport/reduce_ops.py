"""Reduce operations and dtypes the emulated HCCL accepts, and the CPU kernels that apply them.

The kernels work on flat, contiguous CPU tensors (usually views into shared memory). They
are what actually combines the bytes; the simulated cost of a reduction is the timing
model's business, not this module's.

NOTE [the transport's threads]
The kernels here, and the copies the transports make, are torch ops, and torch runs an op
over more than 32,768 elements (``at::internal::GRAIN_SIZE``) on its intra-op thread pool,
which has one thread per core by default. Every rank of a job on one host has such a pool:
``mpirun``, ``multiprocessing`` and a plain ``python`` launch leave it at one thread per
core (``torchrun`` sets ``OMP_NUM_THREADS=1``, Ray sets it to the actor's CPUs), so 2 ranks
on 2 cores ran each 1 MB reduction on 4 OpenMP threads over 2 cores, whose workers spin
waiting for each other while the peer rank waits on shared memory. Measured here (2 cores,
2 ranks, torch's default threads, 1 MB allreduce, mean of 500): 12.6 ms, against 1.7 ms for
gloo (whose reductions are its own single-threaded loops) and 0.125 ms with the share.

So a collective runs its tensor ops (and the composites their copies: scatter, gather, the
fused coalesced forms FSDP2 uses; ``ProcessGroupHCCL._emulator_ops``, :class:`capped_threads`)
on at most :func:`transport_threads` threads: the cores this process may run on (its CPU
affinity), shared among the group's ranks on this host, and never more than the rank's own
setting (``torch.set_num_threads`` is restored when the collective returns or raises, and
costs about 0.1 us a call here). The user's own ops keep the user's setting.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = [
    "SUPPORTED_DTYPES",
    "REDUCIBLE_DTYPES",
    "DTYPE_CODES",
    "CODE_DTYPES",
    "REDUCE_OP_CODES",
    "reduce_op_code",
    "reduce_op_name",
    "check_dtype",
    "combine",
    "combine_out",
    "finish",
    "transport_threads",
    "affinity_cores",
    "capped_threads",
]

#: dtypes the emulated HCCL moves, with their wire codes (stable, 1-based). Gaudi itself has
#: no float64, but the emulator runs on CPU, where gloo (the reference) moves and reduces it;
#: gloo sends the unsigned and float8 dtypes point to point.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.bfloat16: 2,
    torch.float16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.uint8: 6,
    torch.int8: 7,
    torch.bool: 8,
    torch.float64: 9,
    torch.int16: 10,
    torch.uint16: 11,
    torch.uint32: 12,
    torch.uint64: 13,
    torch.float8_e4m3fn: 14,
    torch.float8_e5m2: 15,
}
CODE_DTYPES: dict[int, torch.dtype] = {v: k for k, v in DTYPE_CODES.items()}
SUPPORTED_DTYPES = tuple(DTYPE_CODES)
#: dtypes a reduction accepts: those with CPU add/min/max/mul kernels (not uint16/32/64, float8).
REDUCIBLE_DTYPES = (
    torch.float32, torch.bfloat16, torch.float16, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
)

_RedOp = dist.ReduceOp.RedOpType
#: reduce ops with their wire codes.
REDUCE_OP_CODES: dict[object, int] = {
    _RedOp.SUM: 1,
    _RedOp.AVG: 2,
    _RedOp.MIN: 3,
    _RedOp.MAX: 4,
    _RedOp.PRODUCT: 5,
}
_NAMES = {1: "SUM", 2: "AVG", 3: "MIN", 4: "MAX", 5: "PRODUCT"}


def reduce_op_code(op: object) -> int:
    """Map a ``torch.distributed.ReduceOp`` (or its ``RedOpType``) to a wire code.

    Raises:
        ValueError: for ops HCCL emulation does not support (BAND, BOR, BXOR,
            PREMUL_SUM, ...), naming the op.
    """
    code = REDUCE_OP_CODES.get(getattr(op, "op", op))
    if code is None:
        name = getattr(getattr(op, "op", op), "name", repr(op))
        raise ValueError(f"hccl: unsupported reduce op {name}; supported: {', '.join(_NAMES.values())}")
    return code


def reduce_op_name(code: int) -> str:
    """Human-readable name of a wire reduce-op code."""
    return _NAMES.get(code, f"<unknown op {code}>")


def check_dtype(tensor: torch.Tensor, what: str = "tensor") -> int:
    """Return the wire code of ``tensor``'s dtype.

    Raises:
        TypeError: if the dtype is not one HCCL emulation moves (e.g. complex, quantized),
            naming the dtype; or if the tensor is not on the CPU/"hpu", or not dense.
    """
    if tensor.device.type not in ("cpu", "hpu"):
        raise TypeError(f"hccl: {what} must live on the (emulated) hpu/CPU, got {tensor.device}")
    if tensor.layout != torch.strided:
        raise TypeError(f"hccl: {what} has layout {str(tensor.layout).removeprefix('torch.')}: only dense"
                        " tensors are moved (and sparse COO tensors reduced with SUM by allreduce); call .to_dense()")
    code = DTYPE_CODES.get(tensor.dtype)
    if code is None:
        supported = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"hccl: unsupported dtype {str(tensor.dtype).removeprefix('torch.')} for {what};"
            f" supported: {supported}"
        )
    return code


def check_reduction(code: int, tensor: torch.Tensor, what: str = "tensor") -> int:
    """:func:`check_dtype` for a reduction with op ``code``; also refuses dtypes outside
    :data:`REDUCIBLE_DTYPES` and AVG of bool tensors (an average of truth values has no bool
    result), before anything is sent.

    Raises:
        TypeError: as :func:`check_dtype`, a dtype that cannot be reduced, or AVG of a bool tensor.
    """
    dcode = check_dtype(tensor, what)
    if tensor.dtype not in REDUCIBLE_DTYPES:
        reducible = ", ".join(str(d).removeprefix("torch.") for d in REDUCIBLE_DTYPES)
        raise TypeError(
            f"hccl: {str(tensor.dtype).removeprefix('torch.')} {what} cannot be reduced (it can only be moved);"
            f" reducible dtypes: {reducible}"
        )
    if code == 2 and tensor.dtype == torch.bool:
        raise TypeError(f"hccl: AVG of a bool {what} is not supported; use SUM, MIN, MAX or PRODUCT")
    return dcode


def combine(code: int, acc: torch.Tensor, other: torch.Tensor) -> None:
    """In place: ``acc = acc (op) other`` for reduce-op ``code`` (AVG sums; see finish)."""
    if code in (1, 2):
        if acc.dtype == torch.bool:
            acc.logical_or_(other)
        else:
            acc.add_(other)
    elif code == 3:
        torch.minimum(acc, other, out=acc)
    elif code == 4:
        torch.maximum(acc, other, out=acc)
    elif code == 5:
        if acc.dtype == torch.bool:
            acc.logical_and_(other)
        else:
            acc.mul_(other)
    else:  # pragma: no cover - codes are validated on entry
        raise ValueError(f"hccl: unknown reduce op code {code}")


def combine_out(code: int, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out = a (op) b`` for reduce-op ``code`` without an extra copy (AVG sums)."""
    if out.dtype == torch.bool:
        out.copy_(a)
        combine(code, out, b)
    elif code in (1, 2):
        torch.add(a, b, out=out)
    elif code == 3:
        torch.minimum(a, b, out=out)
    elif code == 4:
        torch.maximum(a, b, out=out)
    elif code == 5:
        torch.mul(a, b, out=out)
    else:  # pragma: no cover
        raise ValueError(f"hccl: unknown reduce op code {code}")


def finish(code: int, acc: torch.Tensor, world_size: int) -> None:
    """Apply the post-step of a reduction in place: AVG divides by ``world_size``.

    Integer AVG truncates toward zero (as NCCL's ncclAvg does for integers).
    """
    if code != 2 or world_size == 1:
        return
    if acc.is_floating_point():
        acc.div_(world_size)
    else:
        torch.div(acc, world_size, rounding_mode="trunc", out=acc)


def transport_threads(local_ranks: int) -> int:
    """Most intra-op threads one rank's collective may use (NOTE [the transport's threads]):
    the cores in this process's CPU affinity divided among ``local_ranks`` ranks on this host,
    at least 1.

    Raises:
        ValueError: ``local_ranks`` is less than 1.
    """
    if local_ranks < 1:
        raise ValueError(f"hccl: local_ranks must be at least 1, got {local_ranks}")
    return max(1, affinity_cores() // local_ranks)


def affinity_cores() -> int:
    """Cores in this process's CPU affinity (the machine's count where there is no affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class capped_threads:  # noqa: N801 - used like a function: `with capped_threads(n):`
    """Context manager: torch's intra-op threads at most ``n`` inside, the caller's setting
    restored on exit, also when the block raises (NOTE [the transport's threads])."""

    __slots__ = ("n", "prev")

    def __init__(self, n: int) -> None:
        self.n = n
        self.prev = 0

    def __enter__(self) -> None:
        self.prev = torch.get_num_threads()
        if self.prev > self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        if self.prev > self.n:
            torch.set_num_threads(self.prev)
