"""Numbers on the command lines of the project's tools, checked where argparse reads them.

``parser.add_argument("--iters", type=count(1, 100_000))`` refuses a value of another type
(``2.5``, ``true``), ``inf``/``nan`` and anything outside the stated range, and argparse's
message names the flag and states the range: ``argument --iters: 0 is not in [1, 100,000]``.
Shared by the tools of every package (``hccl``, ``hpu_runtime``, ``launchers``, ``models``);
standard library only.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["count", "real"]


def _fmt(v: float) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def count(lo: int, hi: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]`` (``unit`` is shown in the message)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not in [{_fmt(lo)}, {_fmt(hi)}]{' ' + unit if unit else ''}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its "invalid ... value" messages
    return parse


def real(lo: float, hi: float, unit: str = "", *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (``(lo, hi]`` if ``lo_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > lo if lo_open else value >= lo
        if not (math.isfinite(value) and low_ok and value <= hi):
            bounds = f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}]"
            raise argparse.ArgumentTypeError(f"{text} is not a finite number in {bounds}{' ' + unit if unit else ''}")
        return value

    parse.__name__ = "number"
    return parse
