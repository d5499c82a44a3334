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
    a = TcpMesh(0, [1], "tok", 10.0, address="127.0.0.2")
    b = TcpMesh(1, [0], "tok", 10.0, address="127.0.0.2")
    try:
        assert a.address.startswith("127.0.0.2:") and b.address.startswith("127.0.0.2:")
        t = threading.Thread(target=b.connect, args=({0: a.address},))
        t.start()
        a.connect({1: b.address})
        t.join(10)
        assert not t.is_alive()
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
