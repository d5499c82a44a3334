"""Work handles returned by the emulated HCCL process group.

The shared-memory transport completes a collective's data movement before the call returns,
so a :class:`HcclWork` is born complete: its future already holds the output tensors (DDP
reads them through ``get_future()``). What is *not* complete yet, in simulated time, is the
collective on the simulated collective stream; ``wait()`` therefore makes the simulated
compute stream wait for the collective's end, as ``work.wait()`` on Gaudi blocks the compute
stream (not the host) until the collective finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.futures import Future

from hpu_runtime.bridge.dynamo_skip import skip_dynamo

__all__ = ["CollectiveRecord", "HcclWork"]


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective as the simulated timeline saw it.

    Attributes:
        seq: per-group sequence number (0-based).
        kind: collective name (allreduce, broadcast, allgather, ...).
        nbytes: bytes of this rank's buffer the timing model was given.
        start_ns, end_ns: simulated collective-stream interval, ns.
        algorithm: algorithm the timing model used.
    """

    seq: int
    kind: str
    nbytes: int
    start_ns: int
    end_ns: int
    algorithm: str = "simple"

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@skip_dynamo  # NOTE [dynamo and a Python ProcessGroup] in hccl.process_group
class HcclWork(dist.Work):
    """A finished collective (see module docstring)."""

    def __init__(self, outputs: list[torch.Tensor], record: CollectiveRecord, device, lazy: bool = False,
                 pending=None, drain=None) -> None:
        """``pending``: a point-to-point operation still under way (see :mod:`hccl.transport.p2p`),
        finished by ``drain(pending)`` at the first ``wait()``/``get_future()``."""
        super().__init__()
        self._lazy = lazy  # a lazy collective: waiting on it launches the graph holding it
        self._outputs = outputs
        self.record = record
        self._device = device
        self._future: Future = Future()
        self._future.set_result(outputs)
        self._pending = pending
        self._drain = drain
        self._source = -1  # a receive's sender (group rank); -1 for other work

    def replace_outputs(self, outputs: list[torch.Tensor]) -> None:
        """Make ``outputs`` the Work's (and its future's) result: a composite collective
        (gather, scatter, fused coalesced) hands back its caller's tensors, not its buffers."""
        self._outputs[:] = list(outputs)

    def set_source(self, rank: int) -> None:
        """Name the group rank a finished receive got its message from."""
        self._source = rank

    def _finish_pending(self) -> None:
        if self._pending is not None and self._drain is not None:
            self._drain(self._pending)
            self._pending = None

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - data already moved
        """Make the simulated compute stream wait for this collective's end; returns True."""
        self._finish_pending()
        if self._device is not None:
            if self._lazy:
                self._device.launch("collective wait")
            self._device.stream_wait(self.record.end_ns)
        return True

    def get_future(self) -> Future:
        """A completed ``torch.futures.Future`` whose value is the list of output tensors."""
        self._finish_pending()
        return self._future

    def is_completed(self) -> bool:
        if self._pending is not None and self._pending.done:
            self._finish_pending()  # a receive that arrived meanwhile: write back, time it
        return self._pending is None

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def source_rank(self) -> int:
        """The group rank a receive got its message from (``dist.recv`` without ``src``
        returns it); -1 for any other work."""
        return self._source

    _source_rank = source_rank  # the name torch.distributed calls

    def synchronize(self) -> None:
        self.wait()
