"""The TCP mesh listens where the group's frozen configuration says, and only on loopback by default."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hccl.config import HcclConfig
from hccl.transport.tcp import TcpMesh, listen_address


def test_listen_address_comes_from_the_config_not_the_environment(monkeypatch):
    """HCCL_SOCKET_ADDR set after the config was read changes nothing; loopback by default."""
    cfg = HcclConfig.from_env({"HCCL_SOCKET_ADDR": "127.0.0.2"})
    monkeypatch.setenv("HCCL_SOCKET_ADDR", "127.0.0.3")
    assert listen_address(cfg.socket_addr, cfg.socket_ifname) == "127.0.0.2"
    assert listen_address() == "127.0.0.1"
    assert listen_address(None, "lo") == "127.0.0.1"
    with pytest.raises(ValueError, match="HCCL_SOCKET_IFNAME='no-such-if0'"):
        listen_address(None, "no-such-if0")


@pytest.mark.timeout(30)
def test_two_leaders_exchange_on_the_configured_address():
    """Two meshes on 127.0.0.2 connect with the job token and move bytes both ways."""
    a, b = _pair(address="127.0.0.2")
    try:
        assert a.address.startswith("127.0.0.2:") and b.address.startswith("127.0.0.2:")
        x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        got = np.empty_like(x)
        sender = threading.Thread(target=a.send, args=(1, b"TEST", 7, memoryview(x).cast("B")))
        sender.start()
        b.recv(0, b"TEST", 7, memoryview(got).cast("B"))
        sender.join(10)
        np.testing.assert_array_equal(got, x)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("address", ["192.0.2.1", "no-such-host.invalid", "300.1.1.1"])
def test_an_address_that_cannot_be_listened_on_is_named_with_its_variable(address):
    """Not an address of this host, a name that does not resolve, not an address at all: a
    ValueError naming where the address came from, not a bare OSError or gaierror."""
    with pytest.raises(ValueError, match=f"cannot listen on '{address}' \\(HCCL_SOCKET_ADDR='{address}'\\)"):
        TcpMesh(0, [1], "tok", 1.0, address=address, origin=f"HCCL_SOCKET_ADDR={address!r}")


def _pair(timeout_s: float = 10.0, address: str = "127.0.0.1") -> tuple[TcpMesh, TcpMesh]:
    """Two connected meshes, ranks 0 and 1, listening on ``address``."""
    a = TcpMesh(0, [1], "tok", timeout_s, address=address)
    b = TcpMesh(1, [0], "tok", timeout_s, address=address)
    t = threading.Thread(target=b.connect, args=({0: a.address},))
    t.start()
    a.connect({1: b.address})
    t.join(10)
    assert not t.is_alive()
    return a, b


def _on_thread(fn, *args) -> tuple[threading.Thread, list]:
    box: list = []

    def run() -> None:
        try:
            fn(*args)
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


@pytest.mark.timeout(60)
def test_pump_moves_large_messages_both_ways_at_once_on_one_thread_each():
    """NOTE [one thread per phase]: two 8 MB messages each way (more than the socket buffers
    hold, so blocking sends one after the other would deadlock) and an empty one, in order."""
    rng = np.random.default_rng(1)
    xa = [rng.standard_normal(2 << 20).astype(np.float32), np.empty(0, np.float32),
          rng.standard_normal(3 << 20).astype(np.float32)]
    xb = [rng.standard_normal(2 << 20).astype(np.float32), np.empty(0, np.float32),
          rng.standard_normal(3 << 20).astype(np.float32)]
    ga, gb = [np.empty_like(x) for x in xb], [np.empty_like(x) for x in xa]
    view = lambda xs: [memoryview(x).cast("B") for x in xs]  # noqa: E731
    a, b = _pair()
    try:
        t, box = _on_thread(b.pump, b"COLL", 3, {0: view(xb)}, {0: view(gb)})
        a.pump(b"COLL", 3, {1: view(xa)}, {1: view(ga)})
        t.join(30)
        assert box == [None]
        for got, want in zip(ga + gb, xb + xa):
            np.testing.assert_array_equal(got, want)
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["order", "size"])
def test_pump_names_a_message_out_of_order_or_of_another_size(case):
    from hccl.transport.shm import PeerFailure

    a, b = _pair()
    try:
        x = np.arange(64 << 10, dtype=np.float32)
        seq, n = (4, x.size) if case == "order" else (3, x.size - 1)
        t, box = _on_thread(a.pump, b"COLL", seq, {1: [memoryview(x).cast("B")]}, {})
        got = np.empty(n, np.float32)
        expected = "expected b'COLL'#3: collectives were called in a different order" if case == "order" \
            else "rank 0 sent 262144 bytes to rank 1, which expected 262140: tensor sizes differ"
        with pytest.raises(PeerFailure, match=expected):
            b.pump(b"COLL", 3, {}, {0: [memoryview(got).cast("B")]})
    finally:
        a.close()
        b.close()
        t.join(10)


@pytest.mark.timeout(60)
def test_pump_names_a_peer_that_closed_its_connection():
    from hccl.transport.tcp import ConnectionLost

    a, b = _pair()
    try:
        a.close()
        got = np.empty(1 << 20, np.float32)
        with pytest.raises(ConnectionLost, match="rank 0 closed its connection to rank 1"):
            b.pump(b"COLL", 1, {}, {0: [memoryview(got).cast("B")]})
    finally:
        b.close()


@pytest.mark.timeout(60)
def test_pump_times_out_naming_the_silent_peer():
    import time

    from hccl.transport.shm import HcclTimeoutError

    a, b = _pair(timeout_s=0.5)
    try:
        got = np.empty(1 << 20, np.float32)
        start = time.monotonic()
        with pytest.raises(HcclTimeoutError, match=r"rank 1 timed out after 0.5 s waiting for rank\(s\) 0"):
            b.pump(b"COLL", 1, {}, {0: [memoryview(got).cast("B")]})
        assert time.monotonic() - start < 5.0
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_pump_stops_when_this_rank_closes_its_mesh_from_another_thread():
    """A failure elsewhere closes the mesh (as the multi-host transport does) while a helper
    thread pumps: the pump raises at once instead of polling closed sockets."""
    import time

    from hccl.transport.tcp import ConnectionLost

    a, b = _pair()
    try:
        got = np.empty(1 << 20, np.float32)
        t, box = _on_thread(b.pump, b"COLL", 1, {}, {0: [memoryview(got).cast("B")]})
        time.sleep(0.2)
        b.close()
        start = time.monotonic()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - start < 2.0
        assert len(box) == 1 and isinstance(box[0], ConnectionLost), box
        assert "closed by this rank" in str(box[0]), box
    finally:
        a.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [1 << 10, 1 << 22], ids=["inline", "pumped"])
def test_a_failed_phase_reports_its_cause_before_its_connections_drop(size):
    """NOTE [the first failure names the cause]: when a phase between hosts fails, the
    transport calls ``on_failure`` with the exception before it closes its TCP connections
    (a peer on another host that sees the closed connection can then read the cause), for
    the inline small phases and the pumped large ones alike."""
    import torch

    from hccl.transport.multihost import HostLayout, HostsTransport
    from hccl.transport.tcp import ConnectionLost

    a, b = _pair()
    events: list = []
    close = b.close

    def closing() -> None:
        events.append("close")
        close()

    b.close = closing
    transport = HostsTransport(HostLayout(((0,), (1,)), 1), arena=None, mesh=b)
    transport.on_failure = lambda exc: events.append(("cause", type(exc).__name__))
    try:
        a.close()  # rank 0 goes away: rank 1's receive fails
        sent, got = torch.ones(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
        with pytest.raises(ConnectionLost, match="rank 0 (closed its connection to|is unreachable from) rank 1"):
            transport.exchange([(0, sent)], [(0, got)], 1, "allreduce")
        assert events[:2] == [("cause", "ConnectionLost"), "close"], events
    finally:
        close()
