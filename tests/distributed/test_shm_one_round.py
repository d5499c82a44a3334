"""The one-round allreduce of a 2-rank group (NOTE [shared-memory protocol] in
hccl/transport/shm.py): one round per slice, and no region rewritten while a peer reads it,
whatever collectives come before and after and however late either rank runs."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks

# 4 KiB staging regions: 1,024 float32 per slice, so every sized case below is many slices
_ENV = {"HCCL_SHM_BUFFER_MB": str(4 / 1024)}


def _data(rank: int, case: int, numel: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(7919 * case + rank).standard_normal(numel).astype(np.float32))


_SIZES = (17 * 1024 + 1, 20 * 1024, 40 * 1024 + 5)
"""float32 elements: all past the 64 KiB small path; 18, 20 and 41 slices of 1,024."""


def _rounds(rank: int, world: int) -> list[int]:
    """Rounds the arena advances for an allreduce of each of :data:`_SIZES`."""
    arena = dist.group.WORLD._coll.arena
    out = []
    for numel in _SIZES:
        t = torch.ones(numel, dtype=torch.float32)
        before = arena.round
        dist.all_reduce(t)
        out.append(arena.round - before)
        assert torch.equal(t, torch.full_like(t, 2.0))
    return out


@pytest.mark.timeout(120)
def test_one_round_per_slice_on_two_ranks() -> None:
    """2 ranks: an allreduce of k slices takes k rounds, not the 2k of the reduce-scatter +
    all-gather path."""
    for rounds in run_ranks(_rounds, 2, env=_ENV):
        assert rounds == [-(-n // 1024) for n in _SIZES]


def _mixed(rank: int, world: int, seed: int) -> list[str]:
    """A seeded sequence of sliced collectives of random sizes, with random delays on either
    rank between and before them, each checked against numpy."""
    rng = random.Random(seed)  # the same sequence on both ranks
    jitter = random.Random(seed * 31 + rank)  # delays differ per rank
    failures = []
    for case in range(60):
        kind = rng.choice(["allreduce", "allreduce", "allreduce", "broadcast", "reduce", "allgather", "small"])
        numel = rng.choice([5, 3000, 17_000, 40_000]) if kind == "small" else rng.randint(17_000, 60_000)
        if jitter.random() < 0.3:
            time.sleep(jitter.random() * 0.004)
        mine = _data(rank, case, numel)
        ref = [_data(r, case, numel).double().numpy() for r in range(world)]
        if kind in ("allreduce", "small"):
            dist.all_reduce(mine)
            exp = np.sum(ref, axis=0)
        elif kind == "broadcast":
            dist.broadcast(mine, src=1)
            exp = ref[1]
        elif kind == "reduce":
            dist.reduce(mine, dst=0)
            exp = np.sum(ref, axis=0) if rank == 0 else ref[rank]
        else:
            outs = [torch.empty(numel) for _ in range(world)]
            dist.all_gather(outs, mine)
            mine, exp = torch.cat(outs), np.concatenate(ref)
        if not np.allclose(mine.double().numpy(), exp, rtol=1e-5, atol=1e-5):
            failures.append(f"case {case} {kind} n={numel}")
    return failures


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", [1, 2])
def test_mixed_collectives_with_delays_match_numpy(seed: int) -> None:
    """One-round allreduces interleaved with two-round collectives and the small path, either
    rank late at random: every result equals numpy's (a region rewritten while the peer
    still read it would show as a wrong sum)."""
    results = run_ranks(_mixed, 2, seed, env=_ENV)
    assert results == [[], []]
