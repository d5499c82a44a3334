"""Shared-memory transport: every rank of a host-local group maps every peer's segment.

NOTE [shared-memory protocol]
Each rank owns one segment: a 4 KiB control block followed by two data regions, ``A`` and
``B``, of ``capacity`` bytes each. A rank only ever writes its own segment and reads its
peers'. A collective runs as a sequence of *rounds*; finishing round ``k`` means writing
``k`` into the control block's ``STATE`` word (a single aligned 8-byte store, published
after the data writes: x86 stores are not reordered with older stores). Waiting for round
``k`` means every peer's ``STATE >= k``.

Every slice of a collective takes two rounds (but see the one-round allreduce below):
round 1 publishes ``A`` (and, on a collective's first slice, the metadata words); round 2
says "I am done reading your ``A`` and my ``B`` holds my part of the result". A rank
rewrites ``A`` only after all peers passed round 2 of the previous slice, and rewrites ``B``
only after all peers passed round 1 of the next slice, so one set of regions is enough and
nothing is overwritten while still being read.

Small messages take one round instead: data goes to ``S[round parity]`` and each rank
reduces every peer's copy itself. A region of parity ``p`` is rewritten two rounds later,
after every peer has signalled the round in between, which it only does once it finished
reading. The metadata words are double-buffered by round parity in the same way.

An allreduce of a few ranks (:data:`~hccl.transport.shm_engine.ONE_ROUND_MAX_RANKS`) takes one
round per slice at every size: each slice goes to ``A`` or ``B``, whichever no peer may still
be reading, and each rank reduces every peer's copy itself. A slice published at round ``k``
is read by the peers until they signal round ``k + 1``. The arena remembers the round of the
last such slice in ``A`` (:attr:`ShmArena.a_read_round`); while this rank has not waited for
a later round, ``A`` is busy (:meth:`ShmArena.a_busy`): the next one-round slice goes to
``B`` and a two-round collective first runs one empty round. ``B`` needs no such record: a
one-round slice takes it only while ``A`` is busy, that is right after a slice in ``A``,
and every earlier reader of ``B`` (a one-round slice before that, or a two-round
collective's results) finished by the round this rank last waited for.

Nothing here is pickled: metadata is fixed-width int64 words.

NOTE [anonymous segments]
A segment is anonymous memory (``memfd_create``): it never has a name in ``/dev/shm``, so
no death of any rank, at any moment (inside the rendezvous included, or SIGKILL from a
launcher tearing the job down), can leave a file behind; the kernel frees the memory when
the last process that maps it is gone. Peers on the host map it through its owner's
descriptor, ``/proc/<owner pid>/fd/<fd>`` (published in the store); the owner closes that
descriptor (:meth:`ShmSegment.unlink`) once every peer has mapped it. Opening another
process's descriptor needs the same user (ptrace read access), which ranks of one job have.

Every wait has a deadline; while waiting, peers are checked for death (their pid) and for
an abort flag they raise when they fail, so a failure on one rank becomes a clear error on
every rank instead of a hang. A wait spins briefly, then sleeps in the kernel until a peer
rings its doorbell (NOTE [futex doorbells] in :mod:`.futex`): every store a peer may wait
for (a round, a point-to-point counter, an abort) is followed by :meth:`ShmArena.ring`.

Length: a little over 400 lines, on purpose: the segment layout, the round protocol and the
waits that poll and sleep on it are one protocol, read together.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Sequence

import numpy as np
import torch

from .futex import PURE_SPIN_S, SPIN_S, fence, futex_wait, futex_wake, request_short_slice
from .reduce_ops import CODE_DTYPES

__all__ = ["ShmSegment", "ShmArena", "PeerFailure", "HcclTimeoutError", "META_FIELDS", "SMALL_BYTES", "ITEMSIZE", "P2P_SLOT_BYTES", "P2P_SENT_W", "P2P_TAKEN_W"]

_MAGIC = 0x4843434C53484D31  # "HCCLSHM1"
_CTRL_BYTES = 4096
_MAGIC_W, _PID_W, _STATE_W, _ABORT_W = 0, 1, 2, 3
_SLEEP_W, _BELL_W = 4, 5  # NOTE [futex doorbells]: "I sleep" flag; the doorbell (its low 32 bits)
_META_W = 8  # metadata slots start here: slot p (round parity) at _META_W + 16 * p
#: names of the metadata words every rank publishes with a collective's first slice.
META_FIELDS = ("seq", "kind", "dtype", "numel", "op", "root", "ready_ns", "x0", "x1", "x2", "x3")
_N_META = len(META_FIELDS)
#: bytes of each of the two small-message regions (one per round parity).
SMALL_BYTES = 64 * 1024
#: bytes of each point-to-point outbox (one per local peer), header included.
P2P_SLOT_BYTES = 256 * 1024
#: control words: messages sent to local rank d / messages taken from local rank s.
P2P_SENT_W, P2P_TAKEN_W = 256, 320
MAX_LOCAL_RANKS = 64
CHECK_S = 0.05
"""Wall seconds between checks of the awaited peers' pids (and the longest kernel sleep): a
dead peer is named within about this long, as before the waits slept."""
_REASON_OFF = 1024  # bytes: abort reason text (utf-8, NUL padded)
_REASON_LEN = 1024
#: bytes per element of every dtype the transport moves.
ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in CODE_DTYPES.values()}


class HcclTimeoutError(RuntimeError):
    """A wait on peers passed the process group's timeout."""


class PeerFailure(RuntimeError):
    """A peer died or aborted while this rank waited for it.

    Attributes:
        dead_rank: the rank whose process was found gone (the root cause a launcher names), or
            None where the failure is not a death seen by a pid check (an abort, a message out
            of order). Kept through pickling (``BaseException`` pickles its ``__dict__``), so
            Ray's driver reads it from a worker's failure.
    """

    def __init__(self, message: str, dead_rank: int | None = None) -> None:
        super().__init__(message)
        self.dead_rank = dead_rank


class ShmSegment:
    """One rank's shared-memory segment (control block + regions ``A`` and ``B``).

    NOTE [anonymous segments] (module docstring): the owner creates anonymous memory; its
    :attr:`path` (``/proc/<pid>/fd/<fd>``) is what peers open while the owner keeps the
    descriptor.

    Args:
        name: a label (shows in ``/proc/<pid>/maps`` as ``/memfd:<name>``); peers pass the
            owner's :attr:`path` instead.
        capacity: bytes in each of the two data regions.
        create: create the segment (owner) or map an existing one by its owner's path (peer).

    Raises:
        RuntimeError: a peer's segment has another size (peers disagree on
            ``HCCL_SHM_BUFFER_MB``).
        OSError: a peer's descriptor cannot be opened (its owner is gone, or another user).
    """

    def __init__(self, name: str, capacity: int, *, create: bool, p2p_slots: int = 0) -> None:
        self.name = name
        self.capacity = capacity
        if p2p_slots > MAX_LOCAL_RANKS:
            raise ValueError(f"hccl: at most {MAX_LOCAL_RANKS} ranks per host, got {p2p_slots}")
        size = _CTRL_BYTES + 2 * capacity + 2 * SMALL_BYTES + p2p_slots * P2P_SLOT_BYTES
        self._fd = -1
        if create:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            self.path = f"/proc/{os.getpid()}/fd/{fd}"
            try:
                os.ftruncate(fd, size)
                self._mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd  # kept open until every peer has mapped the segment (unlink)
        else:
            self.path = name
            fd = os.open(self.path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size != size:
                    raise RuntimeError(
                        f"hccl: shared-memory segment {name} has {os.fstat(fd).st_size} bytes,"
                        f" expected {size}: peers disagree on HCCL_SHM_BUFFER_MB"
                    )
                self._mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self.ctrl = np.frombuffer(self._mm, dtype=np.int64, count=_CTRL_BYTES // 8)
        #: address of the doorbell word in this process (little-endian: its low 32 bits first)
        self.bell_addr = self.ctrl.ctypes.data + 8 * _BELL_W
        raw = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.a = raw[_CTRL_BYTES : _CTRL_BYTES + capacity]
        self.b = raw[_CTRL_BYTES + capacity : _CTRL_BYTES + 2 * capacity]
        s0 = _CTRL_BYTES + 2 * capacity
        self.small = (raw[s0 : s0 + SMALL_BYTES], raw[s0 + SMALL_BYTES : s0 + 2 * SMALL_BYTES])
        p0 = s0 + 2 * SMALL_BYTES
        #: p2p_slot[d]: this rank's outbox to local rank d (written here, read by d).
        self.p2p_slot = [raw[p0 + d * P2P_SLOT_BYTES : p0 + (d + 1) * P2P_SLOT_BYTES] for d in range(p2p_slots)]
        if create:
            self.ctrl[_PID_W] = os.getpid()
            self.ctrl[_MAGIC_W] = _MAGIC

    # ---- control words -------------------------------------------------------------
    @property
    def state(self) -> int:
        return int(self.ctrl[_STATE_W])

    @property
    def pid(self) -> int:
        return int(self.ctrl[_PID_W])

    @property
    def aborted(self) -> bool:
        return bool(self.ctrl[_ABORT_W])

    def abort_reason(self) -> str:
        raw = bytes(self._mm[_REASON_OFF : _REASON_OFF + _REASON_LEN])
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def set_abort(self, reason: str) -> None:
        data = reason.encode("utf-8")[: _REASON_LEN - 1]
        self._mm[_REASON_OFF : _REASON_OFF + _REASON_LEN] = data.ljust(_REASON_LEN, b"\0")
        self.ctrl[_ABORT_W] = 1

    def meta(self, parity: int) -> list[int]:
        """The metadata words of slot ``parity`` (a list of ``len(META_FIELDS)`` ints)."""
        base = _META_W + 16 * parity
        return self.ctrl[base : base + _N_META].tolist()

    def write_meta(self, values: Sequence[int], parity: int) -> None:
        base = _META_W + 16 * parity
        self.ctrl[base : base + _N_META] = values

    def region(self, which: str, dtype: torch.dtype, numel: int, offset_elems: int = 0) -> torch.Tensor:
        """A typed view of ``numel`` elements of region ``"a"`` or ``"b"``."""
        raw = self.a if which == "a" else self.b
        itemsize = ITEMSIZE[dtype]
        start = offset_elems * itemsize
        return raw[start : start + numel * itemsize].view(dtype)

    def unlink(self) -> None:
        """Close the owner's descriptor: no new peer can map the segment (mappings stay valid)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        self.unlink()
        self.a = self.b = self.small = self.p2p_slot = None  # type: ignore[assignment]
        self.ctrl = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere; the OS reclaims at exit
            pass


class ShmArena:
    """The segments of one process group on one host, and the round protocol over them.

    Args:
        segments: every rank's segment, indexed by group rank (``segments[rank]`` is ours).
        rank: this process's index in ``segments``.
        timeout_s: wall seconds any single wait may take before raising.
        names: the global (job) rank of each segment's owner, which errors name (default: the
            index).
    """

    def __init__(
        self, segments: list[ShmSegment], rank: int, timeout_s: float, names: list[int] | None = None
    ) -> None:
        self.segments = segments
        self.rank = rank
        self.me = segments[rank]
        #: the global rank of each local index (error messages name global ranks)
        self.names = list(names) if names is not None else list(range(len(segments)))
        self.peers = [s for i, s in enumerate(segments) if i != rank]
        self.peer_ranks = [self.names[i] for i in range(len(segments)) if i != rank]
        self.timeout_s = timeout_s
        self.round = 0
        self.moved = 0
        """Point-to-point chunks moved by this rank (:meth:`note_progress`): a wait that sees it
        change spins again before it sleeps."""
        self._rings = 0  # doorbell values this rank wrote (NOTE [futex doorbells])
        self._peer_idx = [i for i in range(len(segments)) if i != rank]
        self._small_views: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self.a_read_round = -1
        """The round that published this rank's last one-round slice in ``A``: peers read it
        until their next signal (NOTE [shared-memory protocol])."""

    @property
    def world_size(self) -> int:
        return len(self.segments)

    def small_views(self, parity: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's small-message region of ``parity`` as a ``dtype`` tensor (cached)."""
        key = (parity, dtype)
        views = self._small_views.get(key)
        if views is None:
            n = SMALL_BYTES // ITEMSIZE[dtype]
            views = [seg.small[parity].view(dtype)[:n] for seg in self.segments]
            self._small_views[key] = views
        return views

    def a_busy(self) -> bool:
        """Whether a peer may still be reading this rank's ``A`` (a one-round slice published
        at the last round this rank finished)."""
        return self.round <= self.a_read_round

    def signal(self) -> int:
        """Finish the next round (and wake the peers that sleep); returns its number."""
        self.round += 1
        self.me.ctrl[_STATE_W] = self.round
        self.ring(self._peer_idx)
        return self.round

    def ring(self, targets: Sequence[int], *, always: bool = False) -> None:
        """Wake the ranks of local indices ``targets`` that sleep (all of them if ``always``),
        after this rank published something they may wait for (NOTE [futex doorbells])."""
        fence()
        for i in targets:
            seg = self.segments[i]
            if always or seg.ctrl[_SLEEP_W]:
                self._rings += 1
                seg.ctrl[_BELL_W] = (self.rank + 1) << 24 | (self._rings & 0xFFFFFF)
                futex_wake(seg.bell_addr)

    def wait_all(self, what: str) -> None:
        """Block until every peer finished the current round.

        Raises:
            PeerFailure: a peer aborted or its process is gone.
            HcclTimeoutError: a peer did not arrive within ``timeout_s`` wall seconds.
        """
        target = self.round
        pending = [i for i, s in enumerate(self.peers) if s.ctrl[_STATE_W] < target]
        if not pending:
            return

        def arrived() -> bool:
            pending[:] = [i for i in pending if self.peers[i].ctrl[_STATE_W] < target]
            return not pending

        self._spin(arrived, lambda: pending, what)

    def wait_word(self, seg: ShmSegment, word: int, target: int, what: str, progress=None) -> None:
        """Block until ``seg.ctrl[word] >= target`` (one peer's counter), with the usual checks.

        ``progress`` (no arguments) is called while waiting, e.g. to push queued sends.
        """
        ctrl = seg.ctrl
        if ctrl[word] >= target:
            return
        late = [self.peers.index(seg)] if seg in self.peers else []

        def arrived() -> bool:
            if progress is not None:
                progress()
            return ctrl[word] >= target

        self._spin(arrived, lambda: late, what)

    def wait_until(self, arrived, what: str, awaited: Sequence[int] | None = None,
                   max_sleep_s: float | None = None) -> None:
        """Block until ``arrived()`` (no arguments) is true; dead or aborted peers and the
        timeout raise as in :meth:`wait_all`, naming the ``awaited`` local indices (default:
        every peer). ``max_sleep_s``: the longest sleep on the doorbell, wall seconds, for a
        caller whose ``arrived()`` also pumps work no peer rings for (TCP, NOTE [one thread
        per phase] in :mod:`.tcp`)."""
        late = [self.peers.index(self.segments[i]) for i in awaited] if awaited is not None else list(range(len(self.peers)))
        self._spin(arrived, lambda: late, what, max_sleep_s)

    def note_progress(self, peer: int) -> None:
        """Record that a point-to-point chunk moved to or from local index ``peer`` (whose
        counter this rank just bumped): wake ``peer`` if it sleeps; this rank's own wait
        spins again (NOTE [back-off restarts on progress])."""
        self.moved += 1
        self.ring((peer,))

    def _spin(self, arrived, pending, what: str, max_sleep_s: float | None = None) -> None:
        """Poll ``arrived()`` until true: spin (:data:`~.futex.PURE_SPIN_S`), spin yielding the
        core (up to :data:`~.futex.SPIN_S`), then sleep on this rank's doorbell until a peer
        rings it (NOTE [futex doorbells]), then spin again.

        NOTE [back-off restarts on progress]: one wait can cover a whole multi-chunk message
        (a receive pumps its chunks from inside ``arrived()``); when a chunk moved since the
        last poll, the wait spins again before it sleeps, so a long message is not paced by
        wake-ups.

        After every wake-up the peers are checked for abort, and every :data:`CHECK_S` for
        death; past ``timeout_s`` the peers ``pending()`` returns (indices into
        ``self.peers``) are named in the error.
        """
        if arrived():
            return
        me = self.me.ctrl
        start = now = time.monotonic()
        deadline = start + self.timeout_s
        next_check = start + CHECK_S
        spin_from, seen = start, self.moved
        while True:
            if now - spin_from < SPIN_S:
                for _ in range(16):
                    if arrived():
                        return
                if now - spin_from >= PURE_SPIN_S:
                    os.sched_yield()  # a peer queued on this core runs now, not at the next tick
                now = time.monotonic()
                if self.moved != seen:
                    spin_from, seen = now, self.moved
                continue
            request_short_slice()  # once per thread: NOTE [a short scheduler slice for waiters] in .futex
            bell = int(me[_BELL_W])
            me[_SLEEP_W] = 1
            fence()  # the flag is visible before the check below reads the peers (Dekker)
            try:
                if arrived():
                    return
                nap = max(1e-4, min(next_check, deadline) - now)
                futex_wait(self.me.bell_addr, bell, nap if max_sleep_s is None else min(nap, max_sleep_s))
            finally:
                me[_SLEEP_W] = 0
            if arrived():
                return
            now = time.monotonic()
            spin_from, seen = now, self.moved
            self._check_aborts(what)
            if now >= next_check:
                next_check = now + CHECK_S
                late = pending()
                self._check_peers(late, what)
                if now >= deadline:
                    names = ", ".join(str(self.peer_ranks[i]) for i in late)
                    raise HcclTimeoutError(
                        f"hccl: rank {self.names[self.rank]} timed out after {self.timeout_s:.1f} s"
                        f" in {what} waiting for rank(s) {names}"
                    )

    def _check_aborts(self, what: str) -> None:
        for i, seg in enumerate(self.peers):
            if seg.aborted:
                raise PeerFailure(
                    f"hccl: rank {self.peer_ranks[i]} aborted while rank {self.names[self.rank]} was in {what}:"
                    f" {seg.abort_reason()}"
                )

    def _check_peers(self, pending: list[int], what: str) -> None:
        self._check_aborts(what)
        for i in pending:
            pid = self.peers[i].pid
            if not _pid_alive(pid):
                raise PeerFailure(
                    f"hccl: rank {self.peer_ranks[i]} (pid {pid}) died while rank"
                    f" {self.names[self.rank]} was in {what}",
                    dead_rank=self.peer_ranks[i],
                )

    def abort(self, reason: str) -> None:
        """Tell every peer this rank failed (they raise PeerFailure instead of timing out)."""
        self.me.set_abort(reason)
        self.ring(self._peer_idx, always=True)

    def unlink_own(self) -> None:
        self.me.unlink()

    def close(self) -> None:
        self._small_views.clear()
        for seg in self.segments:
            seg.close()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True
