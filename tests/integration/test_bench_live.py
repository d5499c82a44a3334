"""``python -m hccl.tools.bench --live``: real ranks report the planner's simulated figures plus wall time."""

import csv
import os
import re
import shutil
import sys

import pytest

from hccl.tools.bench import run
from tests.integration.launch_helpers import run as run_cmd


def test_bench_live_matches_planner(tmp_path):
    """2 live ranks, 2 sizes: same sizes, times and bandwidths as planner mode, plus a wall column."""
    out = tmp_path / "live.csv"
    cmd = [sys.executable, "-m", "hccl.tools.bench", "--test", "all_reduce", "--size_range", "4KB", "8KB",
           "--ranks", "2", "--topology", "hls2", "--live", "--csv", str(out), "--timeout", "240"]
    proc = run_cmd(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "live ranks" in proc.stdout and "(ms,measured)" in proc.stdout
    rows = list(csv.DictReader(open(out)))
    ref = run("all_reduce", [4096, 8192], ranks=2, topology="hls2")
    assert [int(r["size"]) for r in rows] == [4096, 8192]
    for live, plan in zip(rows, ref):
        assert float(live["time_ms"]) == plan["time_ms"]
        assert float(live["nw_bw"]) == pytest.approx(plan["nw_bw"], rel=1e-12)
        assert live["algorithm"] == plan["algorithm"] == "direct"
        assert float(live["wall_ms"]) > 0


def test_bench_live_bad_algorithm(capsys):
    """A bad --algorithm is reported before any rank starts."""
    from hccl.tools.bench import main

    assert main(["--live", "--ranks", "2", "--size", "1KB", "--algorithm", "tree"]) == 2
    assert "unknown algorithm 'tree'" in capsys.readouterr().err


def test_bench_live_bad_hccl_variable(capsys, monkeypatch):
    """A bad hccl variable the ranks would read is named before any rank starts."""
    from hccl.tools.bench import main

    monkeypatch.setenv("PT_HCCL_SLICE_SIZE_MB", "1e-6")
    assert main(["--live", "--ranks", "2", "--size", "1KB"]) == 2
    assert "PT_HCCL_SLICE_SIZE_MB=1e-06 must be a number of MiB" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_bench_live_names_a_rank_that_fails_to_create_the_group(capsys, monkeypatch):
    """A failure inside ``init_process_group`` (the MPI transport without mpiexec) is the
    rank's own error in the message, not torchrun's exit summary."""
    from hccl.tools.bench import main

    monkeypatch.setenv("HCCL_TRANSPORT", "mpi")
    assert main(["--live", "--ranks", "2", "--size", "1KB", "--timeout", "100"]) == 2
    err = capsys.readouterr().err
    assert "ranks failed: rank " in err and "MpiUnavailableError: HCCL_TRANSPORT=mpi" in err, err


@pytest.mark.timeout(180)
def test_bench_transport_prints_every_backend_and_size():
    """``python -m hccl.tools.bench_transport`` on 2 ranks: one row per size, shared memory,
    MPI (when mpiexec is installed) and gloo columns, finite positive figures."""
    cmd = [sys.executable, "-m", "hccl.tools.bench_transport", "--ranks", "2", "--iters", "1", "--timeout", "150"]
    proc = run_cmd(cmd, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|") and "B |" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["1 KB", "1 MB", "16 MB", "64 MB"], proc.stdout
    for r in rows:
        cells = [c.strip() for c in r.split("|")[2:5]]
        figures = [float(c.split()[0]) for c in cells if c != "n/a"]
        assert len(figures) >= 2 and all(f > 0 for f in figures), r
    if shutil.which("mpiexec"):
        assert all("n/a" not in r.split("|")[3] for r in rows), proc.stdout


@pytest.mark.timeout(180)
def test_bench_transport_measures_the_multi_host_path():
    """``--hosts 2``: the hccl column is the two-host path (TCP between hosts), MPI is left out
    with a reason; a --hosts that does not divide --ranks is refused. With ``--bind-to-core``
    each rank runs on its own core of those this process may use (its affinity, as the rank
    itself reports it)."""
    cmd = [sys.executable, "-m", "hccl.tools.bench_transport", "--ranks", "2", "--hosts", "2", "--iters", "1",
           "--bind-to-core"]
    proc = run_cmd(cmd, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    allowed = sorted(os.sched_getaffinity(0))
    expected = [allowed[0], allowed[1 % len(allowed)]]
    assert f"2 ranks in 2 emulated hosts, bound to cores {expected}" in proc.stdout, proc.stdout
    assert "hccl (hosts)" in proc.stdout, proc.stdout
    assert "not measured with --hosts 2" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|") and "B |" in line]
    assert len(rows) == 4 and all(float(r.split("|")[2].split()[0]) > 0 for r in rows), proc.stdout
    from hccl.tools.bench_transport import main as bench_transport  # refused before any rank starts

    with pytest.raises(SystemExit, match=re.escape("--hosts must divide --ranks (3); got 2")) as bad:
        bench_transport(["--ranks", "3", "--hosts", "2"])
    assert bad.value.code not in (0, None)  # the interpreter exits non-zero with this message on stderr
