"""Tests of hpu_runtime.api.trace (Chrome-trace export, per-rank files, merge, CLI)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpu_runtime.api.trace import (
    STREAMS,
    TraceEvent,
    load_trace,
    main,
    merge_trace_files,
    merge_traces,
    rank_trace_path,
    to_chrome_trace,
    write_rank_trace,
)

REPO = Path(__file__).resolve().parents[2]


def _rank_events(rank: int) -> list[TraceEvent]:
    return [
        TraceEvent(rank=rank, stream="host", name="accumulate", start_ns=0, dur_ns=6_000),
        TraceEvent(rank=rank, stream="compute", name="graph_launch", start_ns=6_000,
                   dur_ns=1_234_567, args={"recipe": "g0", "n_ops": 12}),
        TraceEvent(rank=rank, stream="collective", name="all_reduce", start_ns=1_240_567,
                   dur_ns=500, args={"bytes": 4096, "obj": object()}),
    ]


def _rows(trace):
    procs = {ev["pid"]: ev["args"]["name"] for ev in trace["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "process_name"}
    threads = {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in trace["traceEvents"]
               if ev["ph"] == "M" and ev["name"] == "thread_name"}
    return procs, threads


def test_chrome_trace_structure_and_units():
    """Spans become X events with ts/dur in microseconds (floats), rows named per rank/stream."""
    trace = json.loads(json.dumps(to_chrome_trace(_rank_events(2))))
    spans = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    assert len(spans) == 3
    launch = next(ev for ev in spans if ev["name"] == "graph_launch")
    assert launch["ts"] == 6.0 and launch["dur"] == pytest.approx(1234.567)
    assert isinstance(launch["ts"], float) and isinstance(launch["dur"], float)
    assert launch["pid"] == 2 and launch["tid"] == STREAMS.index("compute")
    assert launch["args"] == {"recipe": "g0", "n_ops": 12}
    procs, threads = _rows(trace)
    assert procs == {2: "rank 2"}
    assert threads == {(2, 0): "host", (2, 1): "compute", (2, 2): "collective"}


def test_non_json_args_become_strings():
    """Arbitrary objects in args do not break export."""
    trace = to_chrome_trace(_rank_events(0))
    ar = next(ev for ev in trace["traceEvents"] if ev.get("name") == "all_reduce")
    assert isinstance(ar["args"]["obj"], str)


def test_events_sorted_per_row():
    """Spans are ordered by (pid, tid, ts) whatever the input order."""
    evs = list(reversed(_rank_events(1) + _rank_events(0)))
    spans = [ev for ev in to_chrome_trace(evs)["traceEvents"] if ev["ph"] == "X"]
    keys = [(ev["pid"], ev["tid"], ev["ts"]) for ev in spans]
    assert keys == sorted(keys)


@pytest.mark.parametrize("kw, match", [
    ({"stream": "gpu"}, "stream"), ({"rank": -1}, "rank"), ({"start_ns": 1.5}, "start_ns"),
    ({"dur_ns": -2}, "dur_ns"), ({"name": ""}, "name")])
def test_invalid_event(kw, match):
    """Bad fields raise ValueError naming the field."""
    base = dict(rank=0, stream="host", name="x", start_ns=0, dur_ns=1)
    with pytest.raises(ValueError, match=match):
        TraceEvent(**{**base, **kw})


def test_per_rank_files_merge_one_row_per_rank(tmp_path):
    """Four per-rank files merge into a trace with exactly one process row per rank."""
    paths = [write_rank_trace(tmp_path, r, _rank_events(r)) for r in range(4)]
    assert paths[3] == rank_trace_path(tmp_path, 3)
    out = merge_trace_files(tmp_path / "merged.json", paths + [paths[0]])  # duplicate input
    trace = json.loads(out.read_text())
    procs, threads = _rows(trace)
    assert procs == {r: f"rank {r}" for r in range(4)}
    names = [ev for ev in trace["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "process_name"]
    assert len(names) == 4
    assert len(threads) == 12
    assert sum(ev["ph"] == "X" for ev in trace["traceEvents"]) == 3 * 5


def test_write_rank_trace_rejects_other_ranks(tmp_path):
    """A rank file holds only that rank's events."""
    with pytest.raises(ValueError, match="ranks"):
        write_rank_trace(tmp_path, 0, _rank_events(1))


def test_merge_accepts_bare_event_lists(tmp_path):
    """A JSON array of events (the other Chrome-trace form) loads and merges."""
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(to_chrome_trace(_rank_events(5))["traceEvents"]))
    merged = merge_traces([load_trace(bare), to_chrome_trace(_rank_events(6))])
    assert set(_rows(merged)[0]) == {5, 6}


def test_load_rejects_non_trace(tmp_path):
    """Files that are not Chrome traces are a ValueError."""
    (tmp_path / "a.json").write_text('{"foo": 1}')
    (tmp_path / "b.json").write_text("not json")
    for name in ("a.json", "b.json"):
        with pytest.raises(ValueError):
            load_trace(tmp_path / name)


def test_cli_main_in_process(tmp_path, capsys):
    """main(["merge", OUT, IN...]) writes the merged file and reports the rank count."""
    ins = [str(write_rank_trace(tmp_path, r, _rank_events(r))) for r in range(2)]
    assert main(["merge", str(tmp_path / "m.json"), *ins]) == 0
    assert "2 ranks" in capsys.readouterr().out
    assert set(_rows(load_trace(tmp_path / "m.json"))[0]) == {0, 1}
    assert main(["merge", str(tmp_path / "x.json"), str(tmp_path / "missing.json")]) == 1


def test_cli_module_entry_point(tmp_path):
    """python -m hpu_runtime.api.trace merge works as a subprocess."""
    ins = [str(write_rank_trace(tmp_path, r, _rank_events(r))) for r in range(3)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "hpu_runtime.api.trace", "merge",
                           str(tmp_path / "out.json"), *ins],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert set(_rows(json.loads((tmp_path / "out.json").read_text()))[0]) == {0, 1, 2}
