"""Transport benchmark: allreduce over "hccl" (shared memory, and MPI) vs "gloo", side by side.

``python -m hccl.tools.bench_transport [--ranks 2] [--iters 20]`` spawns the ranks on this host,
creates both groups in every rank, and prints for each size the wall-clock latency (1 KB)
or bus bandwidth (larger sizes) of each backend and their ratio. When mpi4py and
``mpiexec`` are installed (``pip install -e '.[mpi]'``) it then runs ``mpiexec -n RANKS
python -m hccl.tools.bench_transport --mpi-worker ...``, which measures "hccl" with
``HCCL_TRANSPORT=mpi`` the same way, and adds that column; without MPI it says so and
prints the rest. ``--hosts H`` splits the ranks into H emulated hosts (``HCCL_HOST_ID``), so the
"hccl" column measures the multi-host path (the schedule executor: shared memory inside a
host, TCP between hosts) and the MPI column is left out. ``--load N`` starts N CPU-bound
processes beside the ranks (and stops them at the end), as a busy laptop or CI runner would
have: every column is measured under the same load. ``--bind-to-core`` pins each rank to one
core (rank ``r`` on the ``r``-th core this process may use, modulo their number), as ``mpirun
--bind-to core --map-by core`` does (Intel's Gaudi examples launch their ranks bound to cores,
``mpirun -n 8 --bind-to core --map-by socket:PE=6``: Intel Gaudi docs, PyTorch Scaling Guide,
"mpirun Configuration"); the MPI run gets ``-bind-to core`` and the busy processes stay
unbound. These are *wall-clock* figures of the emulator's data movement on this machine, not
simulated Gaudi times.

Reading the 1 KB row under load: a 1 KB allreduce's latency is the ranks' own CPU work (idle,
each rank's CPU time per call equals its wall time: the process group, the checks, the timing
model and the copies, in Python), and the ranks move in lockstep. With 2 ranks and one busy
process on 2 cores, a fair scheduler gives each of the three processes 2/3 of a core, so the
loaded latency cannot fall below 1.5x the idle one whatever the waits do, and where the busy
process stays on one rank's core (which it then halves) not below 2x; the waits decide how
far above that it lands (a rank that spins or yields spends the shared core's time). Unbound, the
scheduler tends to put both ranks on one core and leave the other to the busy process: the
ranks then run one after the other, and each switch between them also refills the caches
(measured on a 2-core VM, a rank's CPU time per 1 KB call: 38 us with a core each, 60-70 us
with both ranks on one core, ``taskset -c 0``). ``--bind-to-core`` keeps them apart and shows what is
left, the busy process halving one rank's core; it costs bandwidth, since a bound rank cannot
move away from the busy process (same VM, three alternated runs each, ``--ranks 2 --load 1``:
1 KB 127-141 us unbound, 100-108 us bound, 38 us idle; 64 MB 4.7-4.8 GB/s unbound, 1.9-3.7
bound).

Bus bandwidth follows hccl_demo/nccl-tests: ``busbw = algbw x 2(n-1)/n`` for allreduce,
``algbw = bytes / time``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tabulate import tabulate

from hpu_runtime.cli_args import count, real

__all__ = ["core_of", "main"]

SIZES = [("1 KB", 1024), ("1 MB", 1 << 20), ("16 MB", 16 << 20), ("64 MB", 64 << 20)]


def _time_allreduce(t: torch.Tensor, group, iters: int) -> float:
    """Wall seconds per allreduce of ``t`` on ``group``, as nccl-tests and hccl_demo measure:
    ``iters`` back-to-back calls after a warm-up and a barrier, divided by ``iters``; the
    median of 3 such runs; the slowest rank's figure (a collective is as slow as its last rank).
    """
    for _ in range(5):
        dist.all_reduce(t, group=group)
    runs = []
    for _ in range(3):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        runs.append((time.perf_counter() - t0) / iters)
    worst = torch.tensor([statistics.median(runs)], dtype=torch.float32)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst.item())


def _iters(nbytes: int, iters: int) -> int:
    """Back-to-back calls per timed run: many for latency, fewer for the big sizes. A 1 MB run
    is ``5 x iters`` calls (about 13 ms idle here): with ``iters`` calls it lasted less than one
    scheduler tick (4 ms at this kernel's 250 Hz) and the idle 1 MB figure of five runs of
    the same command spread from 3.9 to 8.7 GB/s; with 100 calls, 8.2 to 8.6."""
    if nbytes <= 1024:
        return iters * 50
    if nbytes <= (1 << 20):
        return iters * 5
    return max(3, iters // 4)


def core_of(rank: int, allowed: set[int]) -> int:
    """The core ``--bind-to-core`` gives ``rank``: the ``rank``-th of the ``allowed`` cores (the
    ones this process may run on), modulo their number, as ``mpirun --bind-to core --map-by
    core`` places ranks."""
    cores = sorted(allowed)
    return cores[rank % len(cores)]


def _worker(rank: int, world: int, init_file: str, iters: int, queue, hosts: int = 1, bind: bool = False) -> None:
    import hpu_runtime

    if bind:
        os.sched_setaffinity(0, {core_of(rank, os.sched_getaffinity(0))})
    if hosts > 1:  # consecutive ranks share an emulated host; hosts talk over TCP
        os.environ["HCCL_HOST_ID"] = f"bench-host{rank * hosts // world}"

    hpu_runtime.deactivate()  # measure the transport, not the bridge
    dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    hccl = dist.group.WORLD
    rows = []
    for label, nbytes in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        row = [label, nbytes]
        for group in (hccl, gloo):
            row.append(_time_allreduce(t, group, _iters(nbytes, iters)))
        rows.append(row)
    cores = None
    if bind:  # where each rank ran, as its own affinity says
        cores = [None] * world
        dist.all_gather_object(cores, sorted(os.sched_getaffinity(0)), group=gloo)
    if rank == 0:
        queue.put((rows, cores))
    dist.destroy_process_group()


def _mpi_worker(init_file: str, out_file: str, iters: int) -> None:
    """One rank of the MPI run (under mpiexec, ``HCCL_TRANSPORT=mpi``): rank 0 writes the times."""
    from mpi4py import MPI

    import hpu_runtime

    hpu_runtime.deactivate()
    rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = []
    for _label, nbytes in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        rows.append(_time_allreduce(t, dist.group.WORLD, _iters(nbytes, iters)))
    if rank == 0:
        Path(out_file).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _run_mpi(ranks: int, iters: int, timeout: float, bind: bool = False) -> tuple[list[float] | None, str]:
    """Seconds per allreduce of each size with ``HCCL_TRANSPORT=mpi``, or None and why not."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
        return None, "MPI not available (no mpiexec or mpi4py): pip install -e '.[mpi]'"
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "HCCL_TRANSPORT"))}
    env.update(HCCL_TRANSPORT="mpi")  # OMP_NUM_THREADS as _bench set it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "rows.json")
        cmd = [mpiexec, *(("-bind-to", "core") if bind else ()), "-n", str(ranks), sys.executable, "-m",
               "hccl.tools.bench_transport", "--mpi-worker", os.path.join(tmp, "init"), out_file, "--iters", str(iters)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None, f"MPI run did not finish within {timeout:.0f} s"
        if proc.returncode != 0 or not os.path.exists(out_file):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return None, f"MPI run failed (exit code {proc.returncode}): {' | '.join(tail)}"
        return json.loads(Path(out_file).read_text()), ""


def _start_load(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (a busy loop each); stopped by :func:`_stop_load`."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)]


def _stop_load(procs: list[subprocess.Popen]) -> None:
    for pr in procs:
        pr.kill()
    for pr in procs:
        pr.wait()


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m hccl.tools.bench_transport", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=count(2, 256, "ranks on this host"), default=2)
    p.add_argument("--iters", type=count(1, 100_000), default=20)
    p.add_argument("--timeout", type=real(1.0, 86_400.0, "wall seconds"), default=600.0,
                   help="wall seconds before giving up (per run)")
    p.add_argument("--hosts", type=count(1, 256, "hosts"), default=1,
                   help="split the ranks into this many emulated hosts (HCCL_HOST_ID): the hccl column is then "
                        "the multi-host path (shared memory inside a host, TCP between hosts); no MPI column")
    p.add_argument("--load", type=count(0, 256, "processes"), default=0,
                   help="start this many CPU-bound processes beside the ranks for the whole run (stopped at the end)")
    p.add_argument("--torch-threads", type=count(0, 1024, "threads"), default=1,
                   help="torch intra-op threads per rank (OMP_NUM_THREADS): 1 (default), as torchrun sets; "
                        "0 leaves torch's default of one per core, as mpirun and a plain launch do")
    p.add_argument("--bind-to-core", action="store_true",
                   help="pin each rank to one core (rank r on the r-th usable core), as mpirun --bind-to core does; "
                        "the busy processes of --load stay unbound")
    p.add_argument("--mpi-worker", nargs=2, metavar=("INIT_FILE", "OUT_FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_worker:
        _mpi_worker(*args.mpi_worker, args.iters)
        return []
    if args.ranks % args.hosts:
        raise SystemExit(f"--hosts must divide --ranks ({args.ranks}); got {args.hosts}")
    load = _start_load(args.load)
    try:
        return _bench(args)
    finally:
        _stop_load(load)


def _bench(args: argparse.Namespace) -> list[dict]:
    # the ranks' intra-op threads (NOTE [the transport's threads] in hccl.transport.reduce_ops)
    if args.torch_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)
    else:
        os.environ.pop("OMP_NUM_THREADS", None)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_worker, args=(r, args.ranks, init_file, args.iters, queue, args.hosts,
                                                   args.bind_to_core))
                 for r in range(args.ranks)]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + args.timeout
        for pr in procs:
            pr.join(max(0.1, deadline - time.monotonic()))
        alive = [pr for pr in procs if pr.is_alive()]
        for pr in alive:
            pr.kill()
        if alive or any(pr.exitcode for pr in procs) or queue.empty():
            raise SystemExit(f"benchmark failed: exit codes {[pr.exitcode for pr in procs]}")
        rows, cores = queue.get()
    if args.hosts > 1:
        mpi_times, why = None, f"not measured with --hosts {args.hosts} (the MPI transport has no emulated hosts)"
    else:
        mpi_times, why = _run_mpi(args.ranks, args.iters, args.timeout, args.bind_to_core)
    n = args.ranks
    factor = 2 * (n - 1) / n
    out = []
    where = f"in {args.hosts} emulated hosts" if args.hosts > 1 else "on this host"
    beside = f", {args.load} busy process(es) beside them" if args.load else ""
    threads = f"{args.torch_threads} torch thread(s)" if args.torch_threads else "torch's default threads"
    bound = f", bound to cores {[c[0] if len(c) == 1 else c for c in cores]}" if args.bind_to_core else ""
    print(f"allreduce, {n} ranks {where}{bound}{beside}, {os.cpu_count()} cores, {threads} per rank,"
          " wall-clock (not simulated) figures")
    if mpi_times is None:
        print(f"hccl (MPI transport): {why}")
    table = []
    for i, (label, nbytes, t_hccl, t_gloo) in enumerate(rows):
        t_mpi = mpi_times[i] if mpi_times is not None else None
        if nbytes <= 1024:  # latency: lower is better, ratios are time / time
            us = [t * 1e6 if t is not None else None for t in (t_hccl, t_mpi, t_gloo)]
            cells = [f"{v:.1f} us" if v is not None else "n/a" for v in us]
            ratios = [f"latency {_ratio(a, b)}" for a, b in ((t_hccl, t_gloo), (t_mpi, t_gloo), (t_mpi, t_hccl))]
            rec = {"size": label, "hccl_latency_us": us[0], "gloo_latency_us": us[2]}
            if t_mpi is not None:
                rec["hccl_mpi_latency_us"] = us[1]
        else:  # bus bandwidth: higher is better, ratios are bw / bw
            bw = [nbytes / t * factor / 1e9 if t is not None else None for t in (t_hccl, t_mpi, t_gloo)]
            cells = [f"{v:.2f} GB/s" if v is not None else "n/a" for v in bw]
            ratios = [f"busbw {_ratio(a, b)}" for a, b in ((bw[0], bw[2]), (bw[1], bw[2]), (bw[1], bw[0]))]
            rec = {"size": label, "hccl_busbw_gbps": bw[0], "gloo_busbw_gbps": bw[2]}
            if t_mpi is not None:
                rec["hccl_mpi_busbw_gbps"] = bw[1]
        table.append([label, *cells, *ratios])
        out.append(rec)
    mine = "hosts" if args.hosts > 1 else "shm"
    print(tabulate(table, headers=["size", f"hccl ({mine})", "hccl (MPI)", "gloo", f"{mine} vs gloo", "MPI vs gloo",
                                   f"MPI vs {mine}"], tablefmt="github", colalign=("right",) * 7))
    sys.stdout.flush()
    return out


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


if __name__ == "__main__":
    main()
