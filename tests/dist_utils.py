"""Start a few ranks for a distributed test, with a timeout on everything.

``run_ranks(fn, world_size, *args)`` starts ``world_size`` fresh processes, each of
which initialises the default process group (``backend``, a file store in a temp dir) and
calls ``fn(rank, world_size, *args)``. It returns the per-rank return values, or raises
``RankFailure`` with every failing rank's traceback. Processes still alive at the deadline
are killed and reported; nothing is left running.

Ranks come from a fork server that has already imported torch, hccl and hpu_runtime
(``multiprocessing``'s "forkserver" start method with a preload list): a rank starts in a
fraction of a second instead of paying torch's import (1.5 to 3 s of CPU) again, which on
a 2-core machine is most of a small distributed test. Each rank is still its own process
with its own memory; nothing runs in the server but imports, and the rank's environment
is applied in the rank (``env``) before its process group is created, as with "spawn".
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankFailure", "giving_up", "stay_silent"]


class RankFailure(AssertionError):
    """One or more ranks raised, died or timed out."""


_PRELOAD = ["torch", "torch.distributed", "numpy", "hccl", "hccl.process_group", "hpu_runtime"]
"""Imported once in the fork server, inherited by every rank."""


def _context():
    """The fork-server context (started on first use in this process, reused after)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _entry(fn, rank, world, init_file, backend, pg_timeout, env, args, out):
    os.environ.update({k: v.format(rank=rank, host=rank // int(env.get("RANKS_PER_HOST", world))) for k, v in env.items()})
    try:
        import torch.distributed as dist

        if backend:
            dist.init_process_group(
                backend,
                init_method=f"file://{init_file}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=pg_timeout),
            )
        result = fn(rank, world, *args)
        out.put((rank, "ok", result))
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        out.put((rank, "err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_ranks(
    fn: Callable,
    world_size: int,
    *args,
    backend: str | None = "hccl",
    timeout: float = 90.0,
    pg_timeout: float = 30.0,
    env: dict[str, str] | None = None,
    expect_errors: bool = False,
) -> list:
    """Run ``fn`` on ``world_size`` fresh ranks; see the module docstring.

    ``env`` values may use ``{rank}`` and ``{host}`` (``rank // RANKS_PER_HOST``, from the
    same ``env``), e.g. ``{"RANKS_PER_HOST": "2", "HCCL_HOST_ID": "host{host}"}`` makes
    two emulated hosts of two ranks each.

    With ``expect_errors=True``, returns per-rank ``("ok", value)``, ``("err", text)`` or
    ``("missing", exit code)`` pairs instead of raising (for tests of failure behaviour).
    """
    ctx = _context()
    out = ctx.Queue()
    base_env = {"OMP_NUM_THREADS": "1"} | (env or {})
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(fn, r, world_size, init_file, backend, pg_timeout, base_env, args, out))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, tuple[str, object]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, status, value = out.get(timeout=min(left, 1.0))
                    results[rank] = (status, value)
                except queue_mod.Empty:
                    if all(not p.is_alive() for p in procs) and out.empty():
                        break
        finally:
            for p in procs:
                p.join(max(0.1, min(5.0, deadline - time.monotonic())))
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    missing = [r for r in range(world_size) if r not in results]
    if expect_errors:
        return [results.get(r, ("missing", procs[r].exitcode)) for r in range(world_size)]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        raise RankFailure(f"ranks {missing} produced no result within {timeout:.0f} s (exit codes {codes})")
    errors = [f"--- rank {r} ---\n{v}" for r, (s, v) in sorted(results.items()) if s == "err"]
    if errors:
        raise RankFailure("\n".join(errors))
    return [results[r][1] for r in range(world_size)]


# ---- a silent peer: alive, but in no collective until the waiting rank has given up ------------
_GAVE_UP = "test/rank0_gave_up"


@contextmanager
def giving_up() -> Iterator[None]:
    """Around the waiting rank's call: when it ends (raised or not), release the silent peers."""
    import torch.distributed as dist

    try:
        yield
    finally:
        dist.distributed_c10d._get_default_store().set(_GAVE_UP, "1")


def stay_silent(limit_s: float = 60.0) -> None:
    """A silent peer: joins nothing until the waiting rank has given up (a store wait, not a sleep)."""
    import torch.distributed as dist

    dist.distributed_c10d._get_default_store().wait([_GAVE_UP], timedelta(seconds=limit_s))
