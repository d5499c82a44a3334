"""Timing seam: process-group collectives timed by the planner, configuration from the environment."""

import time

import pytest

from hccl.sim import timing
from hccl.sim.planner import simulate
from hccl.sim.topology import load_topology

MB = 1 << 20


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for k in ("HCCL_TOPOLOGY", "HCCL_ALGO", "PT_HCCL_SLICE_SIZE_MB"):
        monkeypatch.delenv(k, raising=False)
    timing.reset()
    yield
    timing.reset()


@pytest.mark.parametrize("kind,collective", sorted(timing.KIND_TO_COLLECTIVE.items()))
def test_kinds_match_planner(kind, collective):
    """Every process-group kind gives the planner's end time for the rank asking."""
    n = 8
    ready = [100, 0, 0, 50, 0, 0, 0, 7]
    nbytes = 0 if kind == "barrier" else 3 * MB
    res = simulate(collective, nbytes, load_topology("hls2"), world_size=n, ready_ns=ready, root=2)
    for rank in (0, 5):
        t = timing.collective_times(kind, nbytes, ready, rank=rank, root=2)
        assert t.end_ns == res.end_ns[rank]
        assert t.start_ns == min(100, t.end_ns)
        assert t.algorithm == res.algorithm == "direct"


def test_topology_env_and_algo(monkeypatch):
    """HCCL_TOPOLOGY picks the system, HCCL_ALGO the algorithm, PT_HCCL_SLICE_SIZE_MB the slices."""
    monkeypatch.setenv("HCCL_TOPOLOGY", "hls1")
    t1 = timing.collective_times("allreduce", 8 * MB, [0] * 8)
    assert t1.end_ns == simulate("all_reduce", 8 * MB, load_topology("hls1"), world_size=8).end_ns[0]
    assert timing.get_topology(8).name == "hls1"
    monkeypatch.setenv("HCCL_ALGO", "ring")
    t2 = timing.collective_times("allreduce", 8 * MB, [0] * 8)
    assert t2.algorithm == "ring" and t2.end_ns != t1.end_ns
    monkeypatch.setenv("PT_HCCL_SLICE_SIZE_MB", "1")
    t3 = timing.collective_times("allreduce", 8 * MB, [0] * 8)
    assert t3.end_ns == simulate("all_reduce", 8 * MB, load_topology("hls1"), world_size=8, algorithm="ring",
                                 slice_bytes=MB).end_ns[0]


def test_uneven_alltoall_uses_splits():
    """An uneven alltoall is timed from its split matrix; an even one equals the default split."""
    even = timing.collective_times("alltoall", 4 * 1024 * 4, [0] * 4, splits=[[1024] * 4] * 4)
    assert even.end_ns == simulate("all2all", 16 * 1024, load_topology("hls2"), world_size=4).end_ns[0]
    splits = [[0, 4096, 0, 0], [0] * 4, [0] * 4, [0] * 4]
    t = timing.collective_times("alltoall", 4096 * 4, [0] * 4, rank=1, splits=splits)
    res = simulate("all2all", 4096 * 4, load_topology("hls2"), world_size=4, splits=splits)
    assert t.end_ns == res.end_ns[1] and t.end_ns > even.end_ns


def test_odd_sizes_and_one_rank():
    """A size that is not a whole number of elements is timed in bytes; one rank takes no time."""
    t = timing.collective_times("allgather", 6, [0, 0], dtype_bytes=4)
    assert t.end_ns == simulate("all_gather", 6, load_topology("hls2"), world_size=2, dtype_bytes=1).end_ns[0]
    assert timing.collective_times("allreduce", 4096, [123]) == (123, 123, "direct")


@pytest.mark.parametrize("env,value,match", [
    ("HCCL_TOPOLOGY", "hls9", "HCCL_TOPOLOGY='hls9': unknown topology 'hls9'"),
    ("HCCL_TOPOLOGY", "/nonexistent/topo.toml", "does not exist"),
    ("HCCL_ALGO", "tree", "HCCL_ALGO='tree': unknown algorithm"),
    ("PT_HCCL_SLICE_SIZE_MB", "-1", "PT_HCCL_SLICE_SIZE_MB"),
])
def test_bad_configuration(monkeypatch, env, value, match):
    """A bad environment is a ValueError naming the variable and value, already at get_topology."""
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match):
        timing.get_topology(8)
    timing.reset()
    with pytest.raises(ValueError, match=match):
        timing.collective_times("allreduce", 1024, [0] * 8)


def test_malformed_file_and_world_too_big(monkeypatch, tmp_path):
    """A malformed file, or a world the file's fixed boxes cannot hold, is a clear error."""
    bad = tmp_path / "bad.toml"
    bad.write_text("cards_per_box = [\n")
    monkeypatch.setenv("HCCL_TOPOLOGY", str(bad))
    with pytest.raises(ValueError, match="malformed topology file"):
        timing.get_topology(2)
    small = tmp_path / "small.toml"
    small.write_text("cards_per_box = 2\nnum_boxes = 1\nscale_up_ports_per_peer = 1\nports_per_card = 4\n")
    monkeypatch.setenv("HCCL_TOPOLOGY", str(small))
    assert timing.get_topology(2).cards_per_box == 2
    with pytest.raises(ValueError, match="world size 4 does not fit"):
        timing.collective_times("allreduce", 1024, [0] * 4)


def test_unknown_kind():
    """A collective the model does not know is named in the error."""
    with pytest.raises(ValueError, match="'gather'"):
        timing.collective_times("gather", 1024, [0, 0])


def test_p2p():
    """A point-to-point message takes serialization + latency, or waits for a late receiver."""
    t = timing.p2p_times(MB, src=0, dst=1, src_ready_ns=10, dst_ready_ns=0, world_size=2)
    assert t.start_ns == 10 and t.end_ns > 10 + MB / 40
    late = timing.p2p_times(MB, src=0, dst=1, src_ready_ns=10, dst_ready_ns=10**9, world_size=2)
    assert late.end_ns == 10**9


def test_fast_per_bucket():
    """A DDP bucket's call costs well under a millisecond once its pattern is cached."""
    timing.collective_times("allreduce", 25 * MB, [0] * 8)
    t0 = time.perf_counter()
    for i in range(200):
        timing.collective_times("allreduce", 25 * MB, [i] * 8, rank=i % 8, dtype_bytes=4)
    assert (time.perf_counter() - t0) / 200 < 1e-3
