"""The overhead benchmark's command line (wall-clock figures are its output, not asserted)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_breakdown_names_where_the_time_goes():
    """``--breakdown`` prints the plain step, the no-op dispatch mode, the bridge and the
    bridge's mark_step share, each with a positive time; the launches are part of the step."""
    cmd = [sys.executable, "-m", "hpu_runtime.tools.bench_overhead", "--steps", "2", "--rounds", "1",
           "--hidden", "16", "--breakdown"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and parts[2].endswith("x") and not line.startswith("digits"):
            rows[parts[0].strip()] = float(parts[1])
    assert set(rows) >= {"plain", "no-op dispatch mode", "bridge", "bridge: mark_step"}, out.stdout
    assert all(v > 0 for v in rows.values())
    assert rows["bridge: mark_step"] < rows["bridge"]
