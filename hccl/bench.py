"""hccl_demo-style benchmark over the planner (simulated time, not measured).

Example::

    python -m hccl.bench --test all_reduce --size_range 1KB 1GB --ranks 64 --topology hls2

prints hccl_demo's summary columns per size: size (B), count (elements), type, redop
(reducing tests only), time (ms, simulated), algo_bw and nw_bw (GB/s = 1e9 B/s).
``algo_bw = size / time``; ``nw_bw = algo_bw x factor`` with hccl_demo's factors.
"""

from __future__ import annotations

import argparse
import csv
import logging
import re
import sys
from typing import Sequence

from hccl.planner import simulate
from hccl.topology import load_topology

__all__ = ["TESTS", "bus_factor", "parse_size", "run", "main"]

logger = logging.getLogger(__name__)

TESTS = ("all_reduce", "all_gather", "all2all", "reduce_scatter", "broadcast", "reduce", "send_recv")
"""hccl_demo's tests."""

_DTYPES = {"float": 4, "bfloat16": 2}
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


def parse_size(text: str) -> int:
    """Bytes from ``1KB``, ``32m``, ``1G``, ``4096`` (powers of 1024, like hccl_demo)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGkmg]?[Bb]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1KB, 32MB, 1G or a byte count")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def run(test: str, sizes: Sequence[int], *, ranks: int, topology: str, dtype: str = "float",
        redop: str = "sum", root: int = 0, algorithm: str | None = None) -> list[dict]:
    """Simulate ``test`` at each size; return one hccl_demo summary row per size."""
    topo = load_topology(topology, world_size=ranks)
    db = _DTYPES[dtype]
    rows = []
    for size in sizes:
        size -= size % db
        r = simulate(test, size, topo, world_size=ranks, dtype_bytes=db, root=root, algorithm=algorithm)
        t_ns = max(r.duration_ns, 1)
        algo_bw = size / t_ns  # bytes per ns = GB/s
        rows.append({
            "test": test, "size": size, "count": size // db, "type": dtype,
            "redop": redop if "reduce" in test else "",
            "time_ms": t_ns / 1e6, "algo_bw": algo_bw, "nw_bw": algo_bw * bus_factor(test, ranks),
            "algorithm": r.algorithm,
        })
    return rows


def _sizes(lo: int, hi: int) -> list[int]:
    if lo <= 0 or hi < lo:
        raise ValueError(f"size range must satisfy 0 < min <= max, got {lo} .. {hi}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _print(rows: list[dict], test: str, ranks: int, topology: str, out) -> None:
    red = "reduce" in test
    head = ["size", "count", "type"] + (["redop"] if red else []) + ["time", "algo_bw", "nw_bw", "algo"]
    units = ["(B)", "(elements)", ""] + ([""] if red else []) + ["(ms,sim)", "(GB/s)", "(GB/s)", ""]
    w = 14
    print(f"[SUMMARY REPORT] (simulated, collective={test}, ranks={ranks}, topology={topology})", file=out)
    print("".join(f"{h:<{w}}" for h in head), file=out)
    print("".join(f"{u:<{w}}" for u in units), file=out)
    for r in rows:
        cells = [str(r["size"]), str(r["count"]), r["type"]] + ([r["redop"]] if red else [])
        cells += [f"{r['time_ms']:.3f}", f"{r['algo_bw']:.6f}", f"{r['nw_bw']:.6f}", r["algorithm"]]
        print("".join(f"{c:<{w}}" for c in cells), file=out)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m hccl.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--test", default="all_reduce", choices=TESTS + ("all",))
    p.add_argument("--size", type=parse_size, help="one size (default 32MB if no --size_range)")
    p.add_argument("--size_range", nargs=2, type=parse_size, metavar=("MIN", "MAX"),
                   help="sizes MIN, 2*MIN, ... up to MAX")
    p.add_argument("--ranks", type=int, default=8, help="world size")
    p.add_argument("--topology", default="hls2", help="hls1, hls2, hls3 or a topology file")
    p.add_argument("--data_type", default="float", choices=sorted(_DTYPES))
    p.add_argument("--redop", default="sum", choices=["sum", "avg", "min", "max", "prod"])
    p.add_argument("--test_root", type=int, default=0, help="root of broadcast / reduce")
    p.add_argument("--algorithm", default=None, help="force an algorithm (like HCCL_ALGO)")
    p.add_argument("--csv", metavar="PATH", help="also write the rows to this CSV file")
    # --live: run real ranks through the "hccl" backend. NOT YET WIRED (the lead wires it).
    p.add_argument("--live", action="store_true", help="run real ranks (not yet wired)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING)
    if a.live:
        # TODO(lead): launch torchrun ranks here and report the same simulated figures + wall time.
        p.error("--live is not yet wired: live ranks through the 'hccl' backend come later; "
                "run without --live to use the planner")
    sizes = _sizes(*a.size_range) if a.size_range else [a.size or 32 << 20]
    tests = TESTS if a.test == "all" else (a.test,)
    all_rows = []
    try:
        for t in tests:
            rows = run(t, sizes, ranks=a.ranks, topology=a.topology, dtype=a.data_type, redop=a.redop,
                       root=a.test_root, algorithm=a.algorithm)
            _print(rows, t, a.ranks, a.topology, sys.stdout)
            all_rows += rows
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(all_rows[0]))
            wr.writeheader()
            wr.writerows(all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
