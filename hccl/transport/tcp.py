"""TCP transport between hosts: a full mesh of sockets among the hosts' leader ranks.

NOTE [TCP wire format and trust]
Nothing is pickled. A connection starts with a fixed 64-byte hello: magic ``b"HCCLTCP1"``,
the connecting rank (int64), then the job token (48 ASCII bytes, padded). The listener
compares the token with :func:`hmac.compare_digest` and closes connections that do not
present it, then keeps accepting, so a stray or hostile client cannot join or stall the
job. Every later message is a 24-byte header (magic ``b"HCCL"``, a 4-byte tag, int64
sequence number, int64 payload bytes) followed by the raw payload bytes.

Sockets listen on 127.0.0.1 unless the group's ``HCCL_SOCKET_ADDR`` names an address, or
``HCCL_SOCKET_IFNAME`` names an interface whose IPv4 address is used. Every blocking call
has the process group's timeout; a peer that closes its socket raises
:class:`ConnectionLost` (a :class:`~hccl.transport.shm.PeerFailure`) naming the rank.

NOTE [one thread per phase]
A phase of a collective sends to and receives from several peers at once, and a large send
blocks until its peer reads, so the messages cannot go one after another. They used to go
on helper threads, a sender and a receiver per peer started for each phase; every chunk
each of them moved needed the GIL back, and the threads handed it to each other through
the interpreter's switch interval. :meth:`TcpMesh.pump` moves the whole phase on the
calling thread instead: one ``poll`` over the peers' sockets, one ``send`` or ``recv_into``
per ready socket per wake-up (the sockets keep their timeout, so a call the kernel said is
ready never blocks), headers checked as :meth:`TcpMesh.recv` checks them, and a wait that
restarts whenever a byte moves. Measured with ``python -m hccl.tools.bench_transport --ranks 2
--hosts 2`` on this 2-core machine (1 MB / 16 MB / 64 MB busbw): 0.85 / 1.49 / 1.42 GB/s
with the threads, 2.67 / 3.66 / 3.75 GB/s with the pump; beside one CPU-bound process
(``--load 1``) 0.33 / 0.38 / 0.43 against 0.89 / 1.09 / 1.20. A phase whose sends are small
still goes inline (NOTE [inline small phases] in :mod:`.multihost`).

A phase that also has shared-memory messages (ranks of the same host: every ring step that
crosses a host boundary, and most phases of 2 hosts of 2 ranks) runs on the calling thread
too: its wait on the outboxes calls :meth:`TcpPhase.step` with no wait between polls, and
sleeps on its doorbell at most :data:`~.multihost._TCP_NAP_S` while TCP bytes are still due,
since no peer rings for them. ``--ranks 4 --hosts 2`` (1 KB latency, then 1 / 16 / 64 MB
busbw): 2,107 us / 0.31 / 0.71 / 0.74 GB/s with two threads per peer, 1,374 / 0.42 / 0.90 /
0.93 with the pump on one helper thread, 1,084 / 0.69 / 1.22 / 1.50 on the calling thread
(gloo: about 5,000 us / 0.29 / 1.0-1.15 / 1.1).
"""

from __future__ import annotations

import fcntl
import hmac
import logging
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .shm import HcclTimeoutError, PeerFailure

__all__ = ["TcpMesh", "TcpPhase", "ConnectionLost", "listen_address", "HELLO_BYTES"]

log = logging.getLogger(__name__)

_HELLO_MAGIC = b"HCCLTCP1"
_TOKEN_LEN = 48
HELLO_BYTES = 8 + 8 + _TOKEN_LEN
_HDR = struct.Struct("<4s4sqq")
_MSG_MAGIC = b"HCCL"


def _header(tag: bytes, seq: int, nbytes: int) -> bytes:
    """The header framing a message of ``nbytes`` payload bytes (NOTE [TCP wire format and trust])."""
    return _HDR.pack(_MSG_MAGIC, tag, seq, nbytes)


class ConnectionLost(PeerFailure):
    """A peer's connection closed or broke: it failed, or it dropped its connections because
    another rank failed (the torch face then names that first failure)."""


def _ifname_address(ifname: str) -> str:
    """IPv4 address of interface ``ifname`` (Linux SIOCGIFADDR)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = struct.pack("256s", ifname.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, packed)[20:24])
    except OSError as exc:
        raise ValueError(f"HCCL_SOCKET_IFNAME={ifname!r}: no IPv4 address on that interface ({exc})") from None
    finally:
        s.close()


def listen_address(socket_addr: str | None = None, socket_ifname: str | None = None) -> str:
    """The address to listen on: ``socket_addr``, else ``socket_ifname``'s IPv4 address, else loopback.

    The process group passes its frozen ``HcclConfig.socket_addr``/``socket_ifname``
    (``HCCL_SOCKET_ADDR``/``HCCL_SOCKET_IFNAME``); this module reads no environment.

    Raises:
        ValueError: ``socket_ifname`` has no IPv4 address.
    """
    if socket_addr:
        return socket_addr
    if socket_ifname:
        return _ifname_address(socket_ifname)
    return "127.0.0.1"


def _recv_exact(sock: socket.socket, view: memoryview, what: str) -> None:
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed during {what}")
        got += k


@dataclass(slots=True)
class _Inbound:
    """Messages still awaited from one peer by a :class:`TcpPhase`: the header being read,
    or the payload (``view``), and the bytes of it read so far."""

    items: deque
    hdr: bytearray = field(default_factory=lambda: bytearray(_HDR.size))
    view: memoryview | None = None
    got: int = 0


class TcpMesh:
    """Connections from this leader rank to every other leader rank.

    Args:
        rank: this process's group rank.
        peers: group ranks to connect with (every rank of the other hosts).
        token: the job token every peer must present (from the rendezvous store).
        timeout_s: limit for connecting and for every send/receive, wall seconds.
        address: the address to listen on (:func:`listen_address`; default loopback).
        origin: where ``address`` came from (``HCCL_SOCKET_ADDR='...'``), for errors.
        names: the global rank of each group rank, which errors name (default: the group ranks).

    Raises:
        ValueError: ``address`` cannot be listened on (not an address of this host, or a
            name that does not resolve), naming ``origin``.
    """

    def __init__(self, rank: int, peers: Sequence[int], token: str, timeout_s: float, *,
                 address: str = "127.0.0.1", origin: str = "", names: Sequence[int] | None = None) -> None:
        if len(token.encode()) > _TOKEN_LEN:
            raise ValueError("hccl: job token too long")
        self.rank = rank
        self.names = list(names) if names is not None else None
        self.peers = list(peers)
        self.token = token.encode().ljust(_TOKEN_LEN, b"\0")
        self.timeout_s = timeout_s
        self.conns: dict[int, socket.socket] = {}
        self.refused = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((address, 0))
        except OSError as exc:  # socket.gaierror too: a name that does not resolve
            self._listener.close()
            where = f" ({origin})" if origin else ""
            raise ValueError(f"hccl: rank {self.name(rank)} cannot listen on {address!r}{where}: {exc}") from None
        self._listener.listen(max(8, len(self.peers)))
        self._accept_thread: threading.Thread | None = None
        self._accept_error: BaseException | None = None
        self._closed = False

    def name(self, rank: int) -> int:
        """The global rank errors name for group rank ``rank``."""
        return self.names[rank] if self.names is not None else rank

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    # ---- connection set-up ------------------------------------------------------------
    def connect(self, addresses: dict[int, str]) -> None:
        """Connect to peers with a higher rank, accept those with a lower one (blocking)."""
        lower = {p for p in self.peers if p < self.rank}
        self._accept_thread = threading.Thread(target=self._accept_loop, args=(lower,), daemon=True, name="hccl-tcp-accept")
        self._accept_thread.start()
        for p in self.peers:
            if p > self.rank:
                self.conns[p] = self._dial(p, addresses[p])
        self._accept_thread.join(self.timeout_s)
        if self._accept_error is not None:
            raise self._accept_error
        missing = sorted(lower - set(self.conns))
        if missing:
            raise HcclTimeoutError(f"hccl: rank {self.name(self.rank)}: rank(s) {[self.name(r) for r in missing]} did not connect within {self.timeout_s:.0f} s")
        # keep answering the port: anyone who connects later is refused (and logged)
        threading.Thread(target=self._refuse_loop, daemon=True, name="hccl-tcp-refuse").start()

    def _refuse_loop(self) -> None:
        while not self._closed:
            try:
                self._listener.settimeout(0.5)
                conn, addr = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self._handshake(conn, addr, set())

    def _dial(self, peer: int, address: str) -> socket.socket:
        host, port = address.rsplit(":", 1)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                s = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise HcclTimeoutError(f"hccl: rank {self.name(self.rank)} could not connect to rank {self.name(peer)} at {address}: {exc}") from None
                time.sleep(0.05)
        s.settimeout(self.timeout_s)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(_HELLO_MAGIC + struct.pack("<q", self.rank) + self.token)
        return s

    def _accept_loop(self, expected: set[int]) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            while not expected <= set(self.conns):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._listener.settimeout(left)
                try:
                    conn, addr = self._listener.accept()
                except (TimeoutError, socket.timeout):
                    return
                except OSError:
                    if self._closed:
                        return
                    raise
                peer = self._handshake(conn, addr, expected)
                if peer is not None:
                    self.conns[peer] = conn
        except BaseException as exc:  # noqa: BLE001 - reported to connect()
            self._accept_error = exc

    def _handshake(self, conn: socket.socket, addr, expected: set[int]) -> int | None:
        try:
            conn.settimeout(min(5.0, self.timeout_s))
            buf = bytearray(HELLO_BYTES)
            _recv_exact(conn, memoryview(buf), "hello")
            magic, peer, token = bytes(buf[:8]), struct.unpack("<q", buf[8:16])[0], bytes(buf[16:])
            if magic != _HELLO_MAGIC or not hmac.compare_digest(token, self.token) or peer not in expected:
                raise PermissionError("bad hello")
        except (OSError, PermissionError, ConnectionError) as exc:
            self.refused += 1
            log.warning("hccl: rank %d refused a connection from %s (%s): no valid job token", self.name(self.rank), addr, exc)
            conn.close()
            return None
        conn.settimeout(self.timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return peer

    # ---- messages ---------------------------------------------------------------------
    def send(self, peer: int, tag: bytes, seq: int, payload: memoryview) -> None:
        """Send one framed message (header + raw bytes) to ``peer``."""
        sock = self.conns[peer]
        try:
            sock.sendall(_header(tag, seq, len(payload)))
            if len(payload):
                sock.sendall(payload)
        except (TimeoutError, socket.timeout):
            raise HcclTimeoutError(f"hccl: rank {self.name(self.rank)} timed out sending to rank {self.name(peer)}") from None
        except OSError as exc:
            raise ConnectionLost(f"hccl: rank {self.name(peer)} is unreachable from rank {self.name(self.rank)}: {exc}") from None

    def recv(self, peer: int, tag: bytes, seq: int, into: memoryview) -> None:
        """Receive one framed message from ``peer`` into ``into`` (its size must match)."""
        sock = self.conns[peer]
        hdr = bytearray(_HDR.size)
        try:
            _recv_exact(sock, memoryview(hdr), "a message header")
            if self._check_header(peer, hdr, tag, seq, len(into)):
                _recv_exact(sock, into, "a message payload")
        except (TimeoutError, socket.timeout):
            raise HcclTimeoutError(
                f"hccl: rank {self.name(self.rank)} timed out after {self.timeout_s:.1f} s waiting for rank {self.name(peer)}"
            ) from None
        except ConnectionError as exc:
            raise ConnectionLost(f"hccl: rank {self.name(peer)} closed its connection to rank {self.name(self.rank)} ({exc})") from None

    def pump(self, tag: bytes, seq: int, sends: dict[int, list[memoryview]],
             recvs: dict[int, list[memoryview]]) -> None:
        """Send each ``sends[p]`` message to ``p`` and receive each ``recvs[p]`` from ``p`` (in
        order per peer, each framed as :meth:`send` frames it), all on the calling thread:
        NOTE [one thread per phase].

        Raises:
            PeerFailure: a header that is not the expected message (collectives called in a
                different order) or a size that differs, naming the peer.
            ConnectionLost: a peer closed or broke its connection, naming it; or this rank
                closed the mesh (another thread failed).
            HcclTimeoutError: no byte moved for ``timeout_s`` wall seconds, naming the peers
                still awaited.
        """
        phase = self.phase(tag, seq, sends, recvs)
        while not phase.step(self.timeout_s):
            pass

    def phase(self, tag: bytes, seq: int, sends: dict[int, list[memoryview]],
              recvs: dict[int, list[memoryview]]) -> TcpPhase:
        """The messages of :meth:`pump`, to be moved by calls of :meth:`TcpPhase.step` (a
        caller that also has other work to pump, NOTE [one thread per phase])."""
        return TcpPhase(self, tag, seq, sends, recvs)

    def _check_header(self, peer: int, hdr: bytearray, tag: bytes, seq: int, expected: int) -> int:
        """The payload bytes of the message header ``hdr`` from ``peer``, checked against the
        message awaited (``tag``, ``seq``, ``expected`` bytes).

        Raises:
            PeerFailure: another message (collectives called in a different order on different
                hosts) or another size, naming the peer.
        """
        magic, rtag, rseq, nbytes = _HDR.unpack(hdr)
        if magic != _MSG_MAGIC or rtag != tag or rseq != seq:
            raise PeerFailure(
                f"hccl: rank {self.name(self.rank)} got message {rtag!r}#{rseq} from rank {self.name(peer)}, expected {tag!r}#{seq}:"
                " collectives were called in a different order on different hosts"
            )
        if nbytes != expected:
            raise PeerFailure(
                f"hccl: rank {self.name(peer)} sent {nbytes} bytes to rank {self.name(self.rank)}, which expected {expected}:"
                " tensor sizes differ across hosts"
            )
        return nbytes

    def close(self) -> None:
        """Drop every connection and stop listening. Each connection is shut down before it is
        closed: a thread of this process still polling or reading it (a collective on another
        thread) wakes at once, and the peer sees the end of the stream at once. ``close``
        alone does neither while another thread's ``poll`` holds the socket."""
        self._closed = True
        for s in list(self.conns.values()) + [self._listener]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected (the listener), or already shut down
                pass
            try:
                s.close()
            except OSError:
                pass
        self.conns.clear()


class TcpPhase:
    """One phase's TCP messages in flight (:meth:`TcpMesh.phase`): :meth:`step` moves what the
    sockets are ready for. Same checks and errors as :meth:`TcpMesh.pump`."""

    def __init__(self, mesh: TcpMesh, tag: bytes, seq: int, sends: dict[int, list[memoryview]],
                 recvs: dict[int, list[memoryview]]) -> None:
        self.mesh, self.tag, self.seq = mesh, tag, seq
        self.out: dict[int, deque] = {}
        for p, items in sends.items():
            bufs: deque = deque()
            for v in items:
                bufs.append(memoryview(_header(tag, seq, len(v))))
                if len(v):
                    bufs.append(v)
            if bufs:
                self.out[p] = bufs
        self.inbound = {p: _Inbound(deque(items)) for p, items in recvs.items() if items}
        self.fds = {mesh.conns[p].fileno(): p for p in {*self.out, *self.inbound}}
        self.poller = select.poll()
        self.registered: dict[int, int] = {}
        for p in self.fds.values():
            self._watch(p)
        self.deadline = time.monotonic() + mesh.timeout_s

    @property
    def done(self) -> bool:
        return not self.out and not self.inbound

    def _watch(self, p: int) -> None:
        fd = self.mesh.conns[p].fileno()
        ev = (select.POLLOUT if p in self.out else 0) | (select.POLLIN if p in self.inbound else 0)
        if ev != self.registered.get(fd):
            if ev and fd in self.registered:
                self.poller.modify(fd, ev)
            elif ev:
                self.poller.register(fd, ev)
            else:
                self.poller.unregister(fd)
            self.registered[fd] = ev

    def step(self, timeout_s: float = 0.0) -> bool:
        """Wait up to ``timeout_s`` wall seconds for a ready socket, move one ``send`` or
        ``recv_into`` on each; True when every message is through.

        Raises:
            as :meth:`TcpMesh.pump`.
        """
        if self.done:
            return True
        mesh = self.mesh
        wait = min(timeout_s, max(0.0, self.deadline - time.monotonic()))
        events = self.poller.poll(wait * 1000.0)
        if not events:
            if time.monotonic() >= self.deadline:
                waiting = sorted(self.inbound) or sorted(self.out)
                names = ", ".join(str(mesh.name(p)) for p in waiting)
                raise HcclTimeoutError(f"hccl: rank {mesh.name(mesh.rank)} timed out after {mesh.timeout_s:.1f} s"
                                       f" waiting for rank(s) {names}")
            return False
        out, inbound = self.out, self.inbound
        for fd, ev in events:
            p = self.fds[fd]
            if ev & select.POLLNVAL or mesh._closed:  # this rank closed the mesh (another thread failed)
                raise ConnectionLost(f"hccl: rank {mesh.name(mesh.rank)}'s connection to rank {mesh.name(p)} was closed by this rank")
            if p in inbound and ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                if self._take(p, inbound[p]):
                    del inbound[p]
            elif p in out and ev & (select.POLLHUP | select.POLLERR) and not ev & select.POLLOUT:
                raise ConnectionLost(f"hccl: rank {mesh.name(p)} is unreachable from rank {mesh.name(mesh.rank)}: connection closed")
            if p in out and ev & select.POLLOUT:
                bufs = out[p]
                try:
                    k = mesh.conns[p].send(bufs[0])
                except OSError as exc:
                    raise ConnectionLost(f"hccl: rank {mesh.name(p)} is unreachable from rank {mesh.name(mesh.rank)}: {exc}") from None
                if k == len(bufs[0]):
                    bufs.popleft()
                    if not bufs:
                        del out[p]
                else:
                    bufs[0] = bufs[0][k:]
            self._watch(p)
        self.deadline = time.monotonic() + mesh.timeout_s  # bytes moved: the wait starts again
        return self.done

    def _take(self, peer: int, st: _Inbound) -> bool:
        """Read what ``peer``'s socket holds into the message awaited; True when every
        awaited message from ``peer`` has arrived."""
        mesh = self.mesh
        view = st.view if st.view is not None else memoryview(st.hdr)
        try:
            k = mesh.conns[peer].recv_into(view[st.got:])
        except OSError as exc:
            raise ConnectionLost(f"hccl: rank {mesh.name(peer)} closed its connection to rank {mesh.name(mesh.rank)} ({exc})") from None
        if k == 0:
            what = "a message payload" if st.view is not None else "a message header"
            raise ConnectionLost(f"hccl: rank {mesh.name(peer)} closed its connection to rank {mesh.name(mesh.rank)}"
                                 f" (connection closed during {what})")
        st.got += k
        if st.got < len(view):
            return False
        if st.view is None:  # a header: check it, then take its payload
            into = st.items[0]
            st.got = 0
            if mesh._check_header(peer, st.hdr, self.tag, self.seq, len(into)):
                st.view = into
                return False
        st.items.popleft()
        st.view, st.got = None, 0
        return not st.items


def tensor_bytes_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (no copy)."""
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")
