"""``habana_frameworks.torch.hpu.random``: the simulated card's random generator.

The emulator's "hpu" tensors live on the host, so the card's generator *is* torch's host
generator: seeding through this module and through ``torch.manual_seed`` are one thing, and
a state saved by :func:`get_rng_state` restores both (as a Gaudi checkpoint expects to
restore its HPU generator). The functions are :mod:`hpu_runtime.api.hpu`'s (``torch.hpu``'s).
"""

from hpu_runtime.api.hpu import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
           "set_rng_state", "get_rng_state_all", "set_rng_state_all"]
