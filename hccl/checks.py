"""Argument checks of the process group's collectives, driven by one table.

Every collective's call is described once, in :data:`SIGNATURES`, as a tuple of rules over a
normalised :class:`Call` (``tensors`` for in-place collectives; ``outputs``/``inputs`` as
lists paired by index, each item a tensor or a list of tensors); :func:`check` runs them.
A failed rule raises ``ValueError`` (counts, sizes, roots) or ``TypeError`` (dtypes, device)
on the calling rank before anything is sent, naming the collective, so the group stays
usable. Mismatches *between* ranks are the data plane's to find (they need the peers).

This module is pure: tensors in, exceptions out; no processes, no transport.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .transport.reduce_ops import check_dtype, check_reduction

__all__ = ["Call", "SIGNATURES", "check", "check_splits", "even_splits"]


@dataclass(frozen=True, slots=True)
class Call:
    """One collective call, normalised for :func:`check`.

    ``outputs[i]`` pairs with ``inputs[i]``; an item is a tensor or a list of tensors (one
    per rank for allgather's outputs, reduce_scatter's inputs, alltoall's lists).
    """

    name: str
    """torch's name of the collective, used in messages (``all_gather_into_tensor``...)."""
    world_size: int
    """Ranks in the group."""
    rank: int
    """The calling rank (gather and scatter check the root's arguments only on the root)."""
    tensors: Sequence[torch.Tensor] = ()
    """The tensors of an in-place collective (allreduce, reduce, broadcast, send, recv)."""
    outputs: Sequence = ()
    """Output items, paired with :attr:`inputs` by index."""
    inputs: Sequence = ()
    """Input items, paired with :attr:`outputs` by index."""
    op: int | None = None
    """Reduce-op wire code of a reduction (None: the collective only moves bytes)."""
    root: int | None = None
    """Root rank of a rooted collective."""


Rule = Callable[[Call], None]


def _tensors(items) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for item in items:
        out.extend(item if isinstance(item, (list, tuple)) else [item])
    return out


def _side(call: Call, side: str) -> Sequence:
    return getattr(call, side)


def root(call: Call) -> None:
    """The root rank lies in the group."""
    if call.root is None or not 0 <= call.root < call.world_size:
        raise ValueError(f"hccl: {call.name}: root rank {call.root} out of range for world size {call.world_size}")


def exactly(side: str, count: int) -> Rule:
    """``side`` holds exactly ``count`` items."""

    def rule(call: Call) -> None:
        got = len(_side(call, side))
        if got != count:
            raise ValueError(f"hccl: {call.name} takes exactly {count} {side.rstrip('s')} tensor(s), got {got}")

    return rule


def nonempty(side: str) -> Rule:
    """``side`` holds at least one item."""

    def rule(call: Call) -> None:
        if not _side(call, side):
            raise ValueError(f"hccl: {call.name} needs at least one {side.rstrip('s')} tensor")

    return rule


def paired(call: Call) -> None:
    """As many outputs as inputs, at least one."""
    if len(call.outputs) != len(call.inputs) or not call.outputs:
        raise ValueError(f"hccl: {call.name} needs matching, non-empty output and input lists"
                         f" (got {len(call.outputs)} outputs, {len(call.inputs)} inputs)")


def supported(side: str) -> Rule:
    """Every tensor of ``side`` has a dtype (and device) the emulation moves."""

    def rule(call: Call) -> None:
        for t in _tensors(_side(call, side)):
            check_dtype(t, f"{call.name} {side.rstrip('s')}")

    return rule


def reducible(side: str) -> Rule:
    """Every tensor of ``side`` can be reduced with :attr:`Call.op`."""

    def rule(call: Call) -> None:
        for t in _tensors(_side(call, side)):
            check_reduction(call.op, t, f"{call.name} {side.rstrip('s')}")

    return rule


def written(side: str) -> Rule:
    """No tensor of ``side`` (written by the collective) has elements sharing memory (an
    ``expand``-ed view): writing it is undefined (gloo corrupts the heap)."""

    def rule(call: Call) -> None:
        for t in _tensors(_side(call, side)):
            if t.layout == torch.strided and torch._debug_has_internal_overlap(t) == 1:
                raise ValueError(f"hccl: {call.name} would write into a tensor whose elements share memory"
                                 " (an expanded view?): clone() it first")

    return rule


def one_dtype(*sides: str) -> Rule:
    """All tensors of ``sides`` share one dtype."""

    def rule(call: Call) -> None:
        dtypes = {t.dtype for s in sides for t in _tensors(_side(call, s))}
        if len(dtypes) > 1:
            raise TypeError(f"hccl: {call.name} tensors must share one dtype, got {sorted(map(str, dtypes))}")

    return rule


def per_rank(side: str) -> Rule:
    """Each item of ``side`` is a list of one tensor per rank."""

    def rule(call: Call) -> None:
        for item in _side(call, side):
            if len(item) != call.world_size:
                raise ValueError(f"hccl: {call.name} {side.rstrip('s')} list has {len(item)} tensors,"
                                 f" expected world size {call.world_size}")

    return rule


def matches(side: str, ref: str) -> Rule:
    """Every tensor of ``side[i]`` has the shape and dtype of ``ref[i]``: gloo refuses any other
    ("invalid tensor size"), and Gaudi's hccl copies each rank's part back in the input's shape,
    which fails for another shape of the same element count; taking it would hide, in CI, a bug
    the real run stops on."""

    def rule(call: Call) -> None:
        for item, r in zip(_side(call, side), _side(call, ref)):
            for t in item:
                if t.shape != r.shape or t.dtype != r.dtype:
                    raise ValueError(f"hccl: {call.name} {side.rstrip('s')} tensor ({tuple(t.shape)}, {t.dtype})"
                                     f" does not match the {ref.rstrip('s')} ({tuple(r.shape)}, {r.dtype})")

    return rule


def world_times(big: str, small: str) -> Rule:
    """``big[i]`` holds world size times ``small[i]``'s elements, of its dtype."""

    def rule(call: Call) -> None:
        for b, s in zip(_side(call, big), _side(call, small)):
            want = s.numel() * call.world_size
            if b.numel() != want or b.dtype != s.dtype:
                raise ValueError(f"hccl: {call.name} {big.rstrip('s')} has {b.numel()} elements of {b.dtype},"
                                 f" expected {want} of {s.dtype}")

    return rule


def on_root(*rules: Rule, empty_elsewhere: str) -> Rule:
    """``rules`` on the root; elsewhere ``empty_elsewhere`` must hold no tensors (gather/scatter)."""

    def rule(call: Call) -> None:
        if call.rank == call.root:
            for r in rules:
                r(call)
        elif any(_side(call, empty_elsewhere)):
            raise ValueError(f"hccl: {call.name} {empty_elsewhere} are given on rank {call.rank},"
                             f" which is not the root {call.root}")

    return rule


SIGNATURES: dict[str, tuple[Rule, ...]] = {
    # in place
    "allreduce": (exactly("tensors", 1), reducible("tensors"), written("tensors")),
    "allreduce_coalesced": (nonempty("tensors"), one_dtype("tensors"), reducible("tensors"), written("tensors")),
    "reduce": (root, exactly("tensors", 1), reducible("tensors"), written("tensors")),
    "broadcast": (root, nonempty("tensors"), supported("tensors"), written("tensors")),
    # outputs[i] (per rank) <- inputs[i]
    "allgather": (paired, supported("inputs"), per_rank("outputs"), matches("outputs", "inputs"),
                  written("outputs")),
    "all_gather_into_tensor": (paired, supported("inputs"), world_times("outputs", "inputs"), written("outputs")),
    "all_gather_coalesced": (paired, supported("inputs"), per_rank("outputs"), matches("outputs", "inputs"),
                             written("outputs")),
    # outputs[i] <- inputs[i] (per rank), reduced
    "reduce_scatter": (paired, reducible("outputs"), per_rank("inputs"), matches("inputs", "outputs"),
                       written("outputs")),
    "reduce_scatter_tensor": (paired, reducible("outputs"), world_times("inputs", "outputs"), written("outputs")),
    # one list of per-rank outputs, one of per-rank inputs
    "alltoall": (paired, per_rank("outputs"), per_rank("inputs"), one_dtype("outputs", "inputs"),
                 supported("inputs"), written("outputs")),
    "all_to_all_single": (paired, one_dtype("outputs", "inputs"), supported("inputs"), written("outputs")),
    # rooted, lists only on the root
    "gather": (root, exactly("inputs", 1), supported("inputs"),
               on_root(exactly("outputs", 1), per_rank("outputs"), matches("outputs", "inputs"),
                       written("outputs"), empty_elsewhere="outputs")),
    "scatter": (root, exactly("outputs", 1), supported("outputs"), written("outputs"),
                on_root(exactly("inputs", 1), per_rank("inputs"), matches("inputs", "outputs"),
                        empty_elsewhere="inputs")),
    # point to point
    "send": (exactly("tensors", 1), supported("tensors")),
    "recv": (exactly("tensors", 1), supported("tensors"), written("tensors")),
    "barrier": (),
}
"""Collective name -> the rules its arguments must pass, in order (first failure raises)."""


def check(call: Call) -> None:
    """Run :data:`SIGNATURES` ``[call.name]`` on ``call``.

    Raises:
        ValueError: a count, size, pairing or root is wrong (the message names the collective).
        TypeError: a dtype the emulation does not move (or cannot reduce with ``call.op``), a
            mix of dtypes where one is needed, or a tensor off the CPU/"hpu".
        KeyError: ``call.name`` has no signature (a bug in the caller).
    """
    for rule in SIGNATURES[call.name]:
        rule(call)


def even_splits(rows: int, n: int, name: str) -> list[int]:
    """``n`` equal split sizes of ``rows`` rows (all_to_all_single without split sizes)."""
    if rows % n:
        raise ValueError(f"hccl: all_to_all_single {name} dim 0 = {rows} is not divisible by world size {n}")
    return [rows // n] * n


def check_splits(name: str, splits: Sequence[int], rows: int, n: int) -> None:
    """all_to_all_single's split sizes: ``n`` non-negative entries adding up to dim 0."""
    if len(splits) != n:
        raise ValueError(f"hccl: all_to_all_single {name} split sizes {list(splits)} need {n} entries")
    if sum(splits) != rows or any(s < 0 for s in splits):
        raise ValueError(f"hccl: all_to_all_single {name} split sizes {list(splits)} do not add up to dim 0 = {rows}")
