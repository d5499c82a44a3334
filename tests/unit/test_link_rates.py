"""Simulated time never gets faster on a slower link (NOTE [rates as integers] in
hccl/sim/link_model.py), and topology files give plausible numbers of the right type."""

from __future__ import annotations

import dataclasses

import pytest

from hccl.sim import algorithms
from hccl.sim.link_model import transfer_ns
from hccl.sim.planner import simulate
from hccl.sim.topology import builtin_topologies, load_topology

# rising rates, Gb/s: from the 1 Mb/s floor through values whose thousandths used to round
# (0.0014 and 0.0015 were 1 and 2 milli-bit/ns) up to 1 Tb/s per port
RATES = [0.001, 0.0014, 0.0015, 0.0104, 0.33, 7.7, 100.0, 100.0000001, 1000.0]
REDUCE = [0.001, 0.0026, 8.2, 820.0, 3000.0]  # bytes per ns
CASES = [("all_reduce", 1 << 20), ("all_gather", 96_000), ("reduce_scatter", 1 << 18), ("broadcast", 5_000),
         ("all2all", 1 << 16)]


def _duration(topo, collective: str, nbytes: int, algorithm: str, world: int) -> int:
    res = simulate(collective, nbytes, topo, world_size=world, algorithm=algorithm, slice_bytes=1 << 18)
    return max(res.end_ns) - min(res.start_ns)


def _runs(name: str, algorithm: str, world: int) -> bool:
    """Whether ``algorithm`` runs on ``world`` ranks of ``name`` (some need whole boxes)."""
    try:
        _duration(load_topology(name), "all_reduce", 4096, algorithm, world)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", builtin_topologies())
@pytest.mark.parametrize("algorithm", sorted(algorithms.REGISTRY))
@pytest.mark.parametrize("world", [12, 16])  # a partly used second box; two whole boxes
def test_time_never_rises_with_bandwidth(name, algorithm, world):
    """For every algorithm and built-in topology: raising the scale-up rate, the scale-out rate,
    both, or the reduction rate never makes a collective slower."""
    if not _runs(name, algorithm, world):
        pytest.skip(f"{algorithm} does not run on {world} ranks of {name}")
    base = load_topology(name)
    sweeps = {
        "scale-up": [{"scale_up_line_rate_gbps": r} for r in RATES],
        "scale-out": [{"scale_out_line_rate_gbps": r} for r in RATES],
        "both": [{"scale_up_line_rate_gbps": r, "scale_out_line_rate_gbps": r} for r in RATES],
        "reduce": [{"reduce_bytes_per_ns": r} for r in REDUCE],
    }
    for label, steps in sweeps.items():
        for collective, nbytes in CASES:
            times = [_duration(dataclasses.replace(base, **kw), collective, nbytes, algorithm, world) for kw in steps]
            assert all(a >= b for a, b in zip(times, times[1:])), (label, collective, times)
            if label == "both":
                assert times[0] > times[-1], (collective, times)  # the rate does matter


@pytest.mark.parametrize("rate", [0.001, 0.0014, 0.1, 1 / 3, 25.0, 100.0, 1234.5678])
@pytest.mark.parametrize("amount", [0, 1, 8, 33_424, 8 << 30])
def test_transfer_time_is_never_faster_than_the_rate(rate, amount):
    """ceil(amount / rate), with the rate floored to a millionth: never below the exact time,
    at most 0.1% + 1 ns above it."""
    t = transfer_ns(amount, rate)
    exact = amount / rate
    assert exact - 1e-6 <= t <= exact * (1 + 1e-3) + 1


@pytest.mark.parametrize("rate", [0.0, -1.0, 1e-7, float("inf"), float("nan")])
def test_transfer_refuses_a_rate_that_is_zero_or_absurd(rate):
    with pytest.raises(ValueError, match="rate must be a finite number"):
        transfer_ns(1000, rate)


def test_transfer_refuses_an_amount_it_cannot_time_exactly():
    with pytest.raises(ValueError, match="cannot time"):
        transfer_ns(10**13, 100.0)


@pytest.mark.parametrize(("field", "text", "expected"), [
    ("scale_out_line_rate_gbps", "0.0001", "scale_out_line_rate_gbps must be a number in [0.001"),
    ("scale_up_line_rate_gbps", "0", "scale_up_line_rate_gbps must be a number in [0.001"),
    ("scale_out_line_rate_gbps", "inf", "scale_out_line_rate_gbps must be a number"),
    ("reduce_bytes_per_ns", "1e20", "reduce_bytes_per_ns must be a number in [0.001, 1,000,000"),
    ("reduce_bytes_per_ns", "nan", "reduce_bytes_per_ns must be a number"),
    ("mtu_bytes", "true", "mtu_bytes must be an integer in [256, 65,536]"),
    ("mtu_bytes", "4096.0", "mtu_bytes must be an integer"),
    ("header_bytes", "-1", "header_bytes must be an integer in [0"),
    ("nic_latency_ns", "1e12", "nic_latency_ns must be an integer"),
    ("oversubscription", "0.5", "oversubscription must be a number in [1"),
    ("cards_per_box", "0", "cards_per_box must be an integer in [1, 1,024]"),
    ("generation", "2", "generation must be a string"),
])
def test_topology_file_numbers_are_checked_by_name(tmp_path, field, text, expected):
    path = tmp_path / "t.toml"
    path.write_text(f"cards_per_box = 8\n{field} = {text}\n" if field != "cards_per_box" else f"{field} = {text}\n")
    with pytest.raises(ValueError) as err:
        load_topology(str(path), 16)
    assert expected in str(err.value)


def test_empty_topology_file_is_refused(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("# nothing but a comment\n")
    with pytest.raises(ValueError, match="is empty"):
        load_topology(str(path), 8)
