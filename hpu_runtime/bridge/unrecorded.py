"""Keeping the emulator's own tensor ops out of the user's ``torch.profiler`` traces.

See NOTE [the emulator's own work is not the user's profile] in :mod:`hpu_runtime.bridge.dispatch`.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["unrecorded", "profiler_enabled"]

profiler_enabled = torch.autograd._profiler_enabled
"""Whether a ``torch.profiler`` / autograd profiler is on (a C call, cheap enough per op)."""

_unrecorded = threading.local()


class unrecorded:  # noqa: N801 - used like a function: `with unrecorded():`
    """Context manager: while a profiler is on, torch's RecordFunction is off on this thread
    inside, so the profiler records none of the emulator's own ops (NOTE [the emulator's own
    work is not the user's profile]). Nests; with no profiler on it does nothing. On leaving
    the outermost one, recording is on again (torch offers no way to read the previous state:
    a script that turned RecordFunction off itself finds it on after an op on the card)."""

    __slots__ = ("_on",)

    def __enter__(self) -> None:
        self._on = profiler_enabled()
        if self._on:
            depth = getattr(_unrecorded, "depth", 0)
            _unrecorded.depth = depth + 1
            if depth == 0:
                torch.autograd._enable_record_function(False)

    def __exit__(self, *exc) -> None:
        if self._on:
            _unrecorded.depth -= 1
            if _unrecorded.depth == 0:
                torch.autograd._enable_record_function(True)
