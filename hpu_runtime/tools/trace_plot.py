"""A picture of the simulated Gaudi lanes of profiler traces (a headless stand-in for a trace viewer).

Reads Kineto traces written by ``torch.profiler`` with ``ProfilerActivity.HPU`` (one per rank,
e.g. ``tensorboard_trace_handler``'s files; :mod:`hpu_runtime.api.profiler`) and draws, per
rank, the host, compute-stream and collective-stream lanes on the simulated time axis (µs from
the first device event of each file), one box per event, labelled where there is room::

    python -m hpu_runtime.tools.trace_plot OUT.png rank0.pt.trace.json rank1.pt.trace.json [--tail-us 12000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["device_lanes", "plot", "main"]

_COLOURS = {"host": "#9e9e9e", "compute": "#1f77b4", "collective": "#ff7f0e"}
_LANE_OF_TID = {0: "host", 1: "compute", 2: "collective"}


def device_lanes(trace: dict) -> tuple[str, dict[str, list[tuple[float, float, str]]]]:
    """``(process name, {lane: [(start_us, dur_us, name)]})`` of a trace's simulated device.

    Raises:
        ValueError: the trace has no simulated-Gaudi process.
    """
    events = trace.get("traceEvents", [])
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    pids = [p for p, n in names.items() if "simulated Gaudi" in str(n)]
    if not pids:
        raise ValueError("no simulated Gaudi process in the trace (profile with ProfilerActivity.HPU)")
    pid = pids[0]
    lanes: dict[str, list[tuple[float, float, str]]] = {lane: [] for lane in _COLOURS}
    for e in events:
        if e.get("pid") == pid and e.get("ph") == "X" and e.get("name") != "hpuLaunch":
            lanes[_LANE_OF_TID.get(e.get("tid"), "host")].append((float(e["ts"]), float(e["dur"]), str(e["name"])))
    return names[pid], lanes


def plot(out: str | Path, traces: list[str | Path], tail_us: float | None = None) -> Path:
    """Draw the device lanes of each trace file (one band of three lanes per file) into ``out``;
    with ``tail_us``, only the last ``tail_us`` µs of each rank's device activity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bands = [device_lanes(json.loads(Path(t).read_text())) for t in traces]
    fig, ax = plt.subplots(figsize=(14, 1.2 + 1.3 * len(bands)))
    yticks, ylabels = [], []
    for b, (title, lanes) in enumerate(bands):
        t0 = min((s for spans in lanes.values() for s, _, _ in spans), default=0.0)
        if tail_us is not None:
            t0 = max(t0, max((s + d for spans in lanes.values() for s, d, _ in spans), default=0.0) - tail_us)
            lanes = {k: [(max(s, t0), d - max(0.0, t0 - s), n) for s, d, n in v if s + d > t0] for k, v in lanes.items()}
        for k, lane in enumerate(("host", "compute", "collective")):
            y = -(b * 4 + k)
            yticks.append(y)
            ylabels.append(f"{title.split(' (')[0]} {lane}")
            for start, dur, name in lanes[lane]:
                ax.broken_barh([(start - t0, max(dur, 0.05))], (y - 0.4, 0.8), color=_COLOURS[lane],
                               edgecolor="black", linewidth=0.3)
                if dur > 0 and lane != "host":
                    ax.text(start - t0 + dur / 2, y, name.split(" (")[0][:28], ha="center", va="center", fontsize=6,
                            clip_on=True)
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xlabel("simulated time, µs (" + ("from each rank's first device event)" if tail_us is None else
                  f"the last {tail_us:g} µs of each rank)"))
    ax.set_title("torch.profiler with ProfilerActivity.HPU: simulated Gaudi lanes (host, compute stream, "
                 "collective stream)", fontsize=10)
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.trace_plot", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("traces", nargs="+", help="Kineto trace JSON files (one per rank)")
    ap.add_argument("--tail-us", type=float, default=None, help="show only the last N simulated µs of each rank")
    args = ap.parse_args(argv)
    try:
        print(f"wrote {plot(args.out, args.traces, args.tail_us)}")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
