"""hccl_demo-style benchmark over the planner, or over live ranks (simulated time, not measured).

Example::

    python -m hccl.tools.bench --test all_reduce --size_range 1KB 1GB --ranks 64 --topology hls2
    python -m hccl.tools.bench --test all_reduce --size_range 1KB 1MB --ranks 4 --live

prints hccl_demo's summary columns per size: size (B), count (elements), type, redop
(reducing tests only), time (ms, simulated), algo_bw and nw_bw (GB/s = 1e9 B/s).
``algo_bw = size / time``; ``nw_bw = algo_bw x factor`` with hccl_demo's factors.

With ``--live`` the same figures come from real ranks (``torchrun`` on this host,
:mod:`hccl.tools._bench_worker`) running each call through the "hccl" backend on real tensors:
the simulated time is read from the process groups' history (each call starts from uniform
ready times, so it equals the planner's), and a ``wall`` column adds the measured wall time
per call on this machine (slowest rank, mean over ``--iters``).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from typing import Sequence

from hccl.config import HcclConfig
from hccl.sim import algorithms
from hccl.sim.fabric import ideal
from hpu_runtime.cli_args import count, real
from hccl.sim.planner import simulate
from hccl.sim.topology import load_topology
from hccl.sim.variability import OFF, PPM, Variability, parse

__all__ = ["TESTS", "MAX_LIVE_RANKS", "bus_factor", "parse_size", "run", "run_live", "planner_cost", "main"]

logger = logging.getLogger(__name__)

TESTS = ("all_reduce", "all_gather", "all2all", "reduce_scatter", "broadcast", "reduce", "send_recv")
"""hccl_demo's tests."""

_DTYPES = {"float": 4, "bfloat16": 2}
_T0 = 0.0
MAX_LIVE_RANKS = 16
"""Largest ``--ranks`` for ``--live`` (one process per rank on this host)."""
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}


def bus_factor(test: str, n: int) -> float:
    """hccl_demo's nw_bw / algo_bw factor for ``test`` on ``n`` ranks."""
    if test == "all_reduce":
        return 2 * (n - 1) / n
    if test in ("reduce_scatter", "all2all"):
        return (n - 1) / n
    if test == "all_gather":
        return float(n - 1)
    if test in ("broadcast", "reduce", "send_recv"):
        return 1.0
    raise ValueError(f"unknown test {test!r}; expected one of {', '.join(TESTS)}")


_MAX_SIZE = 1 << 40


def parse_size(text: str) -> int:
    """Bytes from ``1KB``, ``32m``, ``1G``, ``4096`` (powers of 1024, like hccl_demo)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGkmg]?[Bb]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1KB, 32MB, 1G or a byte count")
    size = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if size > _MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {text!r} is over 1 TB per rank")
    return size


def run(test: str, sizes: Sequence[int], *, ranks: int, topology: str, dtype: str = "float",
        redop: str = "sum", root: int = 0, algorithm: str | None = None, ideal_fabric: bool = False,
        variability: Variability = OFF, compute_ns: int = 0) -> list[dict]:
    """Simulate ``test`` at each size; return one hccl_demo summary row per size.

    ``ideal_fabric``: no ECMP contention (:func:`hccl.sim.fabric.ideal`). With ``variability``,
    every rank first computes ``compute_ns`` at its step-0 speed and the collective starts when
    the slowest is ready (NOTE [the slowest member starts the collective]); ``time`` then counts
    from the nominal end of that compute, so it includes the wait (``wait_ms`` column).
    """
    topo = load_topology(topology, world_size=ranks)
    if ideal_fabric:
        topo = ideal(topo)
    db = _DTYPES[dtype]
    wait = compute_ns * (variability.slowest_ppm(ranks, 0) - PPM) // PPM if variability.active else 0
    rows = []
    for size in sizes:
        size -= size % db
        r = simulate(test, size, topo, world_size=ranks, dtype_bytes=db, root=root, algorithm=algorithm)
        rows.append(_row(test, size, db, dtype, redop, ranks, r.duration_ns + max(wait, 0), r.algorithm))
        rows[-1]["wait_ms"] = max(wait, 0) / 1e6
    return rows


def _row(test: str, size: int, db: int, dtype: str, redop: str, ranks: int, t_ns: int, algorithm: str) -> dict:
    t_ns = max(t_ns, 1)
    algo_bw = size / t_ns  # bytes per ns = GB/s
    return {"test": test, "size": size, "count": size // db, "type": dtype,
            "redop": redop if "reduce" in test else "",
            "time_ms": t_ns / 1e6, "algo_bw": algo_bw, "nw_bw": algo_bw * bus_factor(test, ranks),
            "algorithm": algorithm}


def _live_size(test: str, size: int, db: int, ranks: int) -> int:
    """Largest size <= ``size`` the live collective can take (whole elements, split evenly)."""
    unit = db * ranks if test in ("reduce_scatter", "all2all") else db
    return max(unit, size - size % unit)


def run_live(tests: Sequence[str], sizes: Sequence[int], *, ranks: int, topology: str, dtype: str = "float",
             redop: str = "sum", root: int = 0, algorithm: str | None = None, iters: int = 1,
             timeout: float = 600.0) -> list[dict]:
    """Run ``tests`` x ``sizes`` on ``ranks`` live processes (torchrun); one row per test and size.

    Rows carry the planner's columns (from the simulated records) plus ``wall_ms``.

    Raises:
        ValueError: more than :data:`MAX_LIVE_RANKS` ranks, a bad topology/algorithm or
            hccl environment variable (named), or a failed or timed-out run (with the ranks'
            error, or their output).
    """
    if not 1 <= ranks <= MAX_LIVE_RANKS:
        raise ValueError(f"--live runs one process per rank on this host: --ranks must be 1..{MAX_LIVE_RANKS}, "
                         f"got {ranks} (use the planner, without --live, for more)")
    topo = load_topology(topology, world_size=ranks)  # fail early, in this process
    if algorithm:
        algorithms.get(algorithm)
    db = _DTYPES[dtype]
    env = dict(os.environ, HCCL_TOPOLOGY=topology, OMP_NUM_THREADS="1")
    env.pop("HCCL_ALGO", None)
    if algorithm:
        env["HCCL_ALGO"] = algorithm
    HcclConfig.from_env(env)  # the ranks' settings (PT_HCCL_SLICE_SIZE_MB...): a bad one is named here
    rows = []
    with tempfile.TemporaryDirectory(prefix="hccl_bench_") as tmp:
        for test in tests:
            tsizes = sorted({_live_size(test, s, db, ranks) for s in sizes})
            out = os.path.join(tmp, f"{test}.jsonl")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                   "-m", "hccl.tools._bench_worker", "--tests", test, "--sizes", *map(str, tsizes),
                   "--data_type", dtype, "--redop", redop, "--test_root", str(root), "--iters", str(iters),
                   "--topology", topology,
                   "--out", out]
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise ValueError(f"live {test} on {ranks} ranks did not finish within {timeout:.0f} s") from None
            if proc.returncode != 0 or not os.path.exists(out):
                errs = sorted(f for f in os.listdir(tmp) if f.startswith(f"{test}.jsonl.err"))
                if errs:
                    with open(os.path.join(tmp, errs[0])) as f:
                        raise ValueError(f"live {test} on {ranks} ranks failed: {f.read().strip()}")
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                raise ValueError(f"live {test} on {ranks} ranks failed (exit {proc.returncode}):\n{tail}")
            with open(out) as f:
                for line in f:
                    r = json.loads(line)
                    row = _row(test, r["size"], db, dtype, redop, ranks, r["sim_ns"], r["algorithm"])
                    row["wall_ms"] = r["wall_ns"] / 1e6
                    rows.append(row)
    logger.debug("live run on %s: %d rows", topo.name, len(rows))
    return rows


def _sizes(lo: int, hi: int) -> list[int]:
    if lo <= 0 or hi < lo:
        raise ValueError(f"size range must satisfy 0 < min <= max, got {lo} .. {hi}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _print(rows: list[dict], test: str, ranks: int, topology: str, out, live: bool = False) -> None:
    red = "reduce" in test
    head = ["size", "count", "type"] + (["redop"] if red else []) + ["time", "algo_bw", "nw_bw", "algo"]
    units = ["(B)", "(elements)", ""] + ([""] if red else []) + ["(ms,sim)", "(GB/s)", "(GB/s)", ""]
    if live:
        head.append("wall")
        units.append("(ms,measured)")
    w = 14
    mode = "simulated, live ranks" if live else "simulated"
    print(f"[SUMMARY REPORT] ({mode}, collective={test}, ranks={ranks}, topology={topology})", file=out)
    print("".join(f"{h:<{w}}" for h in head), file=out)
    print("".join(f"{u:<{w}}" for u in units), file=out)
    for r in rows:
        cells = [str(r["size"]), str(r["count"]), r["type"]] + ([r["redop"]] if red else [])
        cells += [f"{r['time_ms']:.3f}", f"{r['algo_bw']:.6f}", f"{r['nw_bw']:.6f}", r["algorithm"]]
        if live:
            cells.append(f"{r['wall_ms']:.3f}")
        print("".join(f"{c:<{w}}" for c in cells), file=out)


def planner_cost(test: str, size: int, *, ranks: int, topology: str, repeats: int = 200) -> dict:
    """Wall cost of the planner on this machine: one cold call, then a cached repeat.

    The cold call simulates ``test`` of ``size`` bytes on ``ranks`` ranks from an empty cache;
    the repeats shift every rank's ready time by the same offset (a DDP bucket's pattern on the
    next step), which the cache answers. Returns wall seconds as ``cold_s`` and ``repeat_s``
    (mean per call); these are machine figures, never simulated time.
    """
    import time

    from hccl.sim import planner
    topo = load_topology(topology)
    planner._simulate_cached.cache_clear()
    t0 = time.perf_counter()
    simulate(test, size, topo, world_size=ranks)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, repeats + 1):
        simulate(test, size, topo, world_size=ranks, ready_ns=[i] * ranks)
    return {"cold_s": cold, "repeat_s": (time.perf_counter() - t0) / repeats}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    global _T0
    import time
    _T0 = time.process_time()
    p = argparse.ArgumentParser(prog="python -m hccl.tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--test", default="all_reduce", choices=TESTS + ("all",))
    p.add_argument("--size", type=parse_size, help="one size (default 32MB if no --size_range)")
    p.add_argument("--size_range", nargs=2, type=parse_size, metavar=("MIN", "MAX"),
                   help="sizes MIN, 2*MIN, ... up to MAX")
    p.add_argument("--ranks", type=count(1, 1 << 24, "ranks"), default=8, help="world size")
    p.add_argument("--topology", default="hls2", help="hls1, hls2, hls3 or a topology file")
    p.add_argument("--data_type", default="float", choices=sorted(_DTYPES))
    p.add_argument("--redop", default="sum", choices=["sum", "avg", "min", "max", "prod"])
    p.add_argument("--test_root", type=count(0, (1 << 24) - 1), default=0, help="root of broadcast / reduce")
    p.add_argument("--algorithm", default=None, help="force an algorithm (like HCCL_ALGO)")
    p.add_argument("--csv", metavar="PATH", help="also write the rows to this CSV file")
    p.add_argument("--live", action="store_true",
                   help=f"run real ranks on this host through the 'hccl' backend (--ranks <= {MAX_LIVE_RANKS})")
    p.add_argument("--iters", type=count(1, 100_000), default=1, help="--live: timed calls per size (after one warm-up)")
    p.add_argument("--timeout", type=real(1.0, 86_400.0, "wall seconds"), default=600.0,
                   help="--live: seconds allowed per test")
    p.add_argument("--planner_cost", action="store_true",
                   help="print the planner's wall cost per call (cold, then cached) instead of the table")
    p.add_argument("--fabric", choices=["topology", "ideal"], default="topology",
                   help="the topology file's scale-out fabric (ECMP contention) or an ideal one")
    p.add_argument("--variability", default="off",
                   help="off, on or seed=N,...: the collective waits for the slowest rank's --compute_ms")
    p.add_argument("--compute_ms", type=real(0.0, 1e9, "simulated ms"), default=100.0,
                   help="with --variability: nominal compute before the collective, simulated ms")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING)
    if a.iters < 1:
        p.error("--iters must be >= 1")
    try:
        sizes = _sizes(*a.size_range) if a.size_range else [a.size or 32 << 20]
    except ValueError as exc:
        p.error(f"--size_range: {exc}")
    tests = TESTS if a.test == "all" else (a.test,)
    if a.planner_cost:
        for t in tests:
            c = planner_cost(t, sizes[0], ranks=a.ranks, topology=a.topology)
            print(f"{t} {sizes[0]} B on {a.ranks} ranks ({a.topology}): cold {c['cold_s'] * 1e3:.3f} ms, "
                  f"cached repeat {c['repeat_s'] * 1e6:.1f} us per call (wall, this machine)")
        return 0
    all_rows = []
    try:
        for t in tests:
            if a.live:
                rows = run_live([t], sizes, ranks=a.ranks, topology=a.topology, dtype=a.data_type, redop=a.redop,
                                root=a.test_root, algorithm=a.algorithm, iters=a.iters, timeout=a.timeout)
            else:
                rows = run(t, sizes, ranks=a.ranks, topology=a.topology, dtype=a.data_type, redop=a.redop,
                           root=a.test_root, algorithm=a.algorithm, ideal_fabric=a.fabric == "ideal",
                           variability=parse(a.variability), compute_ns=int(a.compute_ms * 1e6))
            _print(rows, t, a.ranks, a.topology, sys.stdout, live=a.live)
            all_rows += rows
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not a.live:
        import resource
        import time
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        var = parse(a.variability)
        note = f"; variability {var.describe()}, slowest-rank wait {all_rows[-1]['wait_ms']:.3f} ms" if var.active else ""
        print(f"(fabric: {a.fabric}{note}; planner CPU time {time.process_time() - _T0:.2f} s, "
              f"peak RSS {rss:.0f} MB, this machine)")
    if a.csv:
        from hpu_runtime.files import atomic_open

        with atomic_open(a.csv, newline="") as f:  # NOTE [atomic files]: a kill leaves the old table
            wr = csv.DictWriter(f, fieldnames=list(all_rows[0]))
            wr.writeheader()
            wr.writerows(all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
