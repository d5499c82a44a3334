"""Chrome-trace / Perfetto JSON export of the simulated timeline.

One process row (``pid``) per rank, named "rank N"; one thread row (``tid``) per stream:
0 = host, 1 = compute, 2 = collective. Each span is a complete event (``"ph": "X"``) with
``ts`` and ``dur`` in microseconds as floats, converted from the emulator's integer
nanoseconds. Times are simulated, not measured. The JSON loads with ``json`` and opens in
chrome://tracing or https://ui.perfetto.dev.

Ranks write their own file (``write_rank_trace``); the launcher, or the CLI, merges them::

    python -m hpu_runtime.api.trace merge merged.json trace_rank0.json trace_rank1.json

The span record :class:`~hpu_runtime.device.timeline.TraceEvent` (and :data:`STREAMS`) is
the device model's; it is re-exported here.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..device.timeline import STREAMS, TraceEvent
from ..files import atomic_write

__all__ = [
    "STREAMS",
    "TraceEvent",
    "load_trace",
    "main",
    "merge_trace_files",
    "merge_traces",
    "rank_trace_path",
    "to_chrome_trace",
    "write_rank_trace",
    "write_trace",
]

logger = logging.getLogger(__name__)

_TID = {name: i for i, name in enumerate(STREAMS)}


def _metadata(rank: int, streams: Iterable[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
         "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
         "args": {"sort_index": rank}},
    ]
    for stream in sorted(set(streams), key=_TID.__getitem__):
        tid = _TID[stream]
        rows.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                     "args": {"name": stream}})
        rows.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                     "args": {"sort_index": tid}})
    return rows


def _jsonable(args: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(args), default=str))


def to_chrome_trace(events: Iterable[TraceEvent], *,
                    metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build the Chrome-trace JSON object of some events.

    Args:
        events: spans of any ranks and streams, in any order.
        metadata: optional extra top-level fields kept under ``"otherData"``.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``: metadata
        rows first (process and thread names for every rank/stream seen), then complete
        events sorted by (pid, tid, ts).
    """
    spans = sorted(events, key=lambda e: (e.rank, _TID[e.stream], e.start_ns, e.dur_ns))
    streams_by_rank: dict[int, set[str]] = {}
    for e in spans:
        streams_by_rank.setdefault(e.rank, set()).add(e.stream)
    trace_events: list[dict[str, Any]] = []
    for rank in sorted(streams_by_rank):
        trace_events.extend(_metadata(rank, streams_by_rank[rank]))
    for e in spans:
        trace_events.append({
            "ph": "X", "name": e.name, "cat": e.stream, "pid": e.rank, "tid": _TID[e.stream],
            "ts": e.start_ns / 1000.0, "dur": e.dur_ns / 1000.0, "args": _jsonable(e.args)})
    return {"traceEvents": trace_events, "displayTimeUnit": "ns",
            "otherData": _jsonable(metadata or {})}


def write_trace(path: str | Path, trace: Mapping[str, Any]) -> Path:
    """Write a trace object as JSON (parent directories are created), whole or not at all
    (NOTE [atomic files] in :mod:`hpu_runtime.files`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(trace, separators=(",", ":")))


def rank_trace_path(directory: str | Path, rank: int) -> Path:
    """Conventional per-rank file name: ``<directory>/trace_rank<rank>.json``."""
    return Path(directory) / f"trace_rank{rank}.json"


def write_rank_trace(directory: str | Path, rank: int, events: Iterable[TraceEvent]) -> Path:
    """Write one rank's events to ``rank_trace_path(directory, rank)``.

    Raises:
        ValueError: if an event belongs to another rank.
    """
    events = list(events)
    others = {e.rank for e in events} - {rank}
    if others:
        raise ValueError(f"write_rank_trace(rank={rank}) got events of ranks {sorted(others)}")
    return write_trace(rank_trace_path(directory, rank), to_chrome_trace(events))


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read a trace JSON file (an object with ``traceEvents`` or a bare event list).

    Raises:
        ValueError: if the file is not a Chrome trace.
    """
    try:
        obj = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return obj


def merge_traces(traces: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge traces (typically one per rank) into one object.

    Metadata rows are de-duplicated by (name, pid, tid), so each rank keeps one process
    row even if it appears in several inputs; spans are concatenated and sorted by
    (pid, tid, ts). ``otherData`` dicts are merged (later inputs win on a clash).
    """
    meta: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    spans: list[dict[str, Any]] = []
    other: dict[str, Any] = {}
    for trace in traces:
        other.update(trace.get("otherData") or {})
        for ev in trace["traceEvents"]:
            if ev.get("ph") == "M":
                meta.setdefault((ev.get("name"), ev.get("pid"), ev.get("tid")), ev)
            else:
                spans.append(ev)
    pid_tid_ts = lambda ev: (ev.get("pid", 0), ev.get("tid", 0), ev.get("ts", 0.0))  # noqa: E731
    ordered_meta = sorted(meta.values(), key=lambda ev: (ev.get("pid", 0), ev.get("tid", 0),
                                                          str(ev.get("name"))))
    return {"traceEvents": ordered_meta + sorted(spans, key=pid_tid_ts),
            "displayTimeUnit": "ns", "otherData": other}


def merge_trace_files(out: str | Path, inputs: Sequence[str | Path]) -> Path:
    """Load, merge and write trace files; returns the output path.

    Raises:
        ValueError: if no input is given or an input is not a Chrome trace.
    """
    if not inputs:
        raise ValueError("merge needs at least one input trace")
    merged = merge_traces(load_trace(p) for p in inputs)
    return write_trace(out, merged)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m hpu_runtime.api.trace merge OUT IN1 [IN2 ...]``."""
    parser = argparse.ArgumentParser(prog="python -m hpu_runtime.api.trace",
                                     description="Simulated Gaudi timeline traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="merge per-rank Chrome traces into one file")
    merge.add_argument("out", help="output JSON file")
    merge.add_argument("inputs", nargs="+", help="per-rank trace JSON files")
    args = parser.parse_args(argv)
    try:
        path = merge_trace_files(args.out, args.inputs)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    n_ranks = len({ev.get("pid") for ev in load_trace(path)["traceEvents"]
                   if ev.get("ph") == "M" and ev.get("name") == "process_name"})
    print(f"wrote {path} ({n_ranks} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
