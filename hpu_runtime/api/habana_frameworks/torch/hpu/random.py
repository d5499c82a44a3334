"""``habana_frameworks.torch.hpu.random``: the simulated card's random generator.

The emulator's "hpu" tensors live on the host, so the card's generator *is* torch's host
generator: seeding through this module and through ``torch.manual_seed`` are one thing, and
a state saved by :func:`get_rng_state` restores both (as a Gaudi checkpoint expects to
restore its HPU generator).
"""

from __future__ import annotations

import torch

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
           "set_rng_state", "get_rng_state_all", "set_rng_state_all"]


def manual_seed(seed: int) -> None:
    """Seed the card's generator."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every card of this process (one)."""
    torch.manual_seed(seed)


def seed() -> None:
    """Seed from a non-deterministic source."""
    torch.seed()


def seed_all() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(device: object = "hpu") -> torch.Tensor:
    """The generator state as a uint8 tensor."""
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: object = "hpu") -> None:
    torch.set_rng_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if len(new_states) != 1:
        raise ValueError(f"set_rng_state_all: this process has 1 card, got {len(new_states)} states")
    torch.set_rng_state(new_states[0])
