"""hccl_demo-style benchmark CLI."""

import csv

import pytest

from hccl.tools.bench import bus_factor, main, parse_size, run


def test_parse_size():
    """Sizes in hccl_demo units (powers of 1024)."""
    assert parse_size("1KB") == 1024 and parse_size("32m") == 32 << 20 and parse_size("4096") == 4096
    assert parse_size("1G") == 1 << 30


def test_bus_factors():
    """hccl_demo's nw_bw factors."""
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("reduce_scatter", 8) == bus_factor("all2all", 8) == pytest.approx(0.875)
    assert bus_factor("all_gather", 8) == 7
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == bus_factor("send_recv", 8) == 1


def test_rows_consistent():
    """algo_bw = size / time and nw_bw = algo_bw x factor."""
    rows = run("all_reduce", [1 << 20, 1 << 22], ranks=8, topology="hls2")
    for r in rows:
        assert r["algo_bw"] == pytest.approx(r["size"] / (r["time_ms"] * 1e6))
        assert r["nw_bw"] == pytest.approx(r["algo_bw"] * 1.75)
    assert rows[1]["nw_bw"] > rows[0]["nw_bw"]


def test_cli_all_tests_and_csv(tmp_path, capsys):
    """--test all prints every hccl_demo test; --csv writes the rows."""
    path = tmp_path / "out.csv"
    assert main(["--test", "all", "--size_range", "1KB", "2KB", "--ranks", "4", "--csv", str(path)]) == 0
    text = capsys.readouterr().out
    for t in ("all_reduce", "all_gather", "all2all", "reduce_scatter", "broadcast", "reduce", "send_recv"):
        assert f"collective={t}," in text
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 14 and {"size", "count", "type", "redop", "time_ms", "algo_bw", "nw_bw"} <= set(rows[0])


def test_cli_live_too_many_ranks(capsys):
    """--live refuses more ranks than this host should run, before starting any process."""
    assert main(["--live", "--ranks", "17", "--size", "1KB"]) == 2
    assert "--ranks must be 1..16" in capsys.readouterr().err


def test_cli_bad_topology(capsys):
    """An unknown topology is reported, not a traceback."""
    assert main(["--topology", "nope", "--ranks", "2", "--size", "1KB"]) == 2
    assert "unknown topology" in capsys.readouterr().err


def test_cli_bad_size_range(capsys):
    """An empty or non-positive --size_range is a usage error naming it, not a traceback."""
    for lo, hi in (("0", "1KB"), ("2KB", "1KB")):
        with pytest.raises(SystemExit) as e:
            main(["--size_range", lo, hi, "--ranks", "2"])
        assert e.value.code == 2
        assert "--size_range: size range must satisfy 0 < min <= max" in capsys.readouterr().err
