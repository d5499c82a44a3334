"""Files the project writes (summaries, study outputs, traces, benchmark tables), written whole
or not at all.

NOTE [atomic files]
A writer that is killed, or fails, halfway must not leave a torn file where a good one was
(``models.train --summary`` written in place was a 0-byte file after a kill in 3 runs of 3).
:func:`atomic_open` writes to a temporary file in the destination's directory (same file
system), flushes it to disk, then renames it over the destination: the rename is atomic, so
a reader, or a later run, finds the old file or the new one, never a mix. A kill before the
rename leaves the old file and a hidden ``.<name>.*.tmp`` beside it; any failure inside the
block removes the temporary file and leaves the old one. The new file gets the old file's
permissions, or the process's default (umask) for a new one.

This module lives at ``hpu_runtime``'s top because every package that writes files may import
it: ``hpu_runtime`` (traces, metric dumps), ``hccl``'s tools, ``launchers`` and ``models``
(``hpu_runtime`` itself may import no other of them). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_open", "atomic_write"]


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file for writing that replaces ``path`` when the block ends without
    error (NOTE [atomic files]).

    Args:
        path: the destination; its directory must exist.
        mode: ``"w"`` (text) or ``"wb"`` (binary).
        **kwargs: passed to :func:`open` (``newline``, ``encoding``).

    Raises:
        ValueError: a mode that does not write a new file.
        OSError: the directory is missing or not writable (the destination is untouched).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    try:
        perms = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        perms = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, perms)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` whole or not at all (NOTE [atomic
    files]); returns ``path`` as a :class:`~pathlib.Path`."""
    binary = isinstance(data, (bytes, bytearray, memoryview))
    with atomic_open(path, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
        f.write(data)
    return Path(path)
