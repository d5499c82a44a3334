"""``te.recipe``: the fp8 recipe types (accepted, not used: fp8 is not emulated)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Format(enum.Enum):
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"


@dataclass
class DelayedScaling:
    """Delayed-scaling recipe fields as transformer-engine names them."""

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    reduce_amax: bool = True
