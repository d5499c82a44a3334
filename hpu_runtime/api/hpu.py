"""The ``torch.hpu`` API of the simulated Gaudi (registered as ``torch.hpu``; ``habana_frameworks.torch.hpu``
re-exports exactly these names, so transformers' ``torch.hpu.manual_seed_all`` and a script's
``hthpu.wrap_in_hpu_graph`` reach the same objects).

One simulated device per process: ``current_device()`` is 0, as in a Gaudi job where each
rank is bound to one card; ``device_count()`` is the server's cards, as Gaudi's. Memory figures
come from the HBM model (bytes of resident storages, simulated); times from the simulated
timeline.

NOTE [streams and events]
The simulated card has one compute queue: the work of every stream runs on it, in issue
order, so a stream changes no timing. A :class:`Stream` is nevertheless a stream in its own
right, as on Gaudi: ``hpu.Stream()`` makes a new one with its own ``stream_id``, distinct
from the default stream (id 0) and from every other; two handles are equal exactly when
they name the same stream (same id). ``with hpu.stream(s):`` (or :func:`set_stream`) makes
``s`` the calling thread's :func:`current_stream`. :meth:`Event.record` is a lazy-mode
launch point: it launches the pending graph and stamps the time its work ends on the
compute stream; :meth:`Event.elapsed_time` is the difference in *simulated* milliseconds.
"""

from __future__ import annotations

import functools
import importlib
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..bridge import autocast as amp
from ..bridge.config import CARDS_PER_BOX, visible_modules
from ..bridge.runtime import get_device
from ..bridge.hpu_graphs import HPUGraph, ModuleCacher, graph, make_graphed_callables, wrap_in_hpu_graph
from .hpex_kernels import recompute_sdp_enabled, sdp_kernel

__all__ = [
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "init",
    "get_device_properties",
    "get_arch_list",
    "get_gencode_flags",
    "memory_usage",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "setDeterministic",
    "getDeterministic",
    "synchronize",
    "mark_step",
    "get_device_name",
    "get_amp_supported_dtype",
    "is_bf16_supported",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "mem_get_info",
    "memory_stats",
    "Stream",
    "Event",
    "stream",
    "set_stream",
    "current_stream",
    "default_stream",
    "HPUGraph",
    "graph",
    "make_graphed_callables",
    "ModuleCacher",
    "wrap_in_hpu_graph",
    "amp",
    "memory_summary",
    "enable_dynamic_shape",
    "disable_dynamic_shape",
    "get_dynamic_shape_status",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "is_autocast_hpu_enabled",
    "get_autocast_hpu_dtype",
    "sdp_kernel",
    "recompute_sdp_enabled",
    "graphs",
    "memory",
    "metrics",
    "random",
]

_SUBMODULES = ("graphs", "memory", "metrics", "random")


def __getattr__(name: str):
    """``torch.hpu.memory``, ``.random``, ``.metrics``, ``.graphs``: Gaudi's submodules, imported on first use."""
    if name in _SUBMODULES:
        return importlib.import_module(f"habana_frameworks.torch.hpu.{name}")
    raise AttributeError(f"module 'torch.hpu' has no attribute {name!r} (not emulated by the simulated Gaudi; "
                         "hpu_runtime/api/habana_frameworks/torch/__init__.py lists what is)")


def is_available() -> bool:
    """Always True: the simulated Gaudi needs no hardware."""
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    get_device()


def device_count() -> int:
    """Gaudi devices visible to this process, as Gaudi's ``device_count()`` answers (SynapseAI's
    ``synDeviceGetCount``): the cards of one server, 8, or as many as ``HABANA_VISIBLE_MODULES``
    lists. The process uses one of them, ``hpu:0`` (:func:`current_device` is 0), as every
    Gaudi rank does; launchers size a job by this count (``accelerate launch``,
    ``deepspeed``, Lightning's ``devices="auto"``, Ray's "HPU" resource).

    Raises:
        ValueError: a malformed ``HABANA_VISIBLE_MODULES``, naming it.
    """
    modules = visible_modules()
    return CARDS_PER_BOX if modules is None else len(modules)


def current_device() -> int:
    return 0


def set_device(device: int | str | torch.device) -> None:
    """Accepted for compatibility; every rank owns exactly one simulated card."""


def _index(device: object) -> int:
    """The card index ``device`` names: -1 for None or a negative int, else its index (0 for a
    bare ``"hpu"``)."""
    if device is None:
        return -1
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = torch.device(device)
    if d.type != "hpu":
        raise ValueError(f"torch.hpu.device expects an hpu device or index, got {device!r}")
    return 0 if d.index is None else d.index


class device:  # noqa: N801 - Gaudi's name (torch.hpu.device, as torch.cuda.device)
    """Context manager that selects the card, as ``torch.hpu.device(idx)`` does on Gaudi (torch
    itself uses it: ``UntypedStorage.to("hpu")`` copies a storage under it).
    Every rank owns one simulated card, ``hpu:0``: entering changes nothing.

    Raises:
        ValueError: an index other than 0 (or None / -1, "no change"), or a device of another type.
    """

    def __init__(self, device: object) -> None:
        idx = _index(device)
        if idx not in (-1, 0):
            raise ValueError(f"hpu device {idx}: each process has one simulated card, hpu:0")
        self.idx = idx

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


class device_of(device):  # noqa: N801 - Gaudi's name
    """``torch.hpu.device`` of ``obj``'s card (no change for a tensor off the card)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "hpu" else -1)


def init() -> None:
    """Initialise the card now (``torch.hpu.init()``); the simulated one is ready at import."""


def get_device_properties(device: object = None) -> str:
    """The card's properties as one string, as Gaudi's returns a string (its fields here: the
    name, HBM bytes, TPC and MME counts of the simulated device's spec).

    Raises:
        ValueError: an index other than 0 (one card per process).
    """
    torch.hpu.device(device)  # validates the index
    spec = get_device().spec
    return f"(name='{spec.name.upper()}', dramSize={spec.hbm_bytes}, num_tpc={spec.num_tpc}, num_mme={spec.num_mme})"


def get_arch_list() -> list[str]:
    """``[get_device_name()]``, as Gaudi's."""
    return [get_device_name()]


def get_gencode_flags() -> str:
    """Empty, as Gaudi's (there are no gencode flags)."""
    return ""


def memory_usage(device: object = None) -> int:
    """HBM bytes in use (Gaudi's reads ``InUse`` of the memory statistics, as hl-smi shows it)."""
    return memory_stats(device)["InUse"]


def memory_reserved(device: object = None) -> int:
    """HBM bytes the allocator manages: the card's whole ``Limit``, as Gaudi's allocator reserves it."""
    return memory_stats(device)["Limit"]


def max_memory_reserved(device: object = None) -> int:
    """Same as :func:`memory_reserved` (Gaudi's reserves the whole ``Limit`` from the start)."""
    return memory_reserved(device)


def memory_cached(device: object = None) -> int:
    """Deprecated name of :func:`memory_reserved` (FutureWarning, as Gaudi's)."""
    warnings.warn("torch.hpu.memory_cached has been renamed to torch.hpu.memory_reserved", FutureWarning, stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: object = None) -> int:
    """Deprecated name of :func:`max_memory_reserved` (FutureWarning, as Gaudi's)."""
    warnings.warn("torch.hpu.max_memory_cached has been renamed to torch.hpu.max_memory_reserved", FutureWarning,
                  stacklevel=2)
    return max_memory_reserved(device)


def setDeterministic(val: bool) -> None:  # noqa: N802 - Gaudi's name
    """Deprecated on Gaudi in favour of ``torch.use_deterministic_algorithms``, which it calls here."""
    warnings.warn("torch.hpu.setDeterministic is deprecated; use torch.use_deterministic_algorithms", FutureWarning,
                  stacklevel=2)
    torch.use_deterministic_algorithms(bool(val))


def getDeterministic() -> bool:  # noqa: N802 - Gaudi's name
    """Deprecated on Gaudi in favour of ``torch.are_deterministic_algorithms_enabled``, which it returns here."""
    warnings.warn("torch.hpu.getDeterministic is deprecated; use torch.are_deterministic_algorithms_enabled",
                  FutureWarning, stacklevel=2)
    return torch.are_deterministic_algorithms_enabled()


def get_device_name(device: object = None) -> str:
    """Device name as Gaudi software reports it, e.g. ``"GAUDI2"``."""
    return get_device().spec.name.upper()


def synchronize(device: object = None) -> None:
    """Launch pending work and make the host wait for every simulated stream."""
    get_device().synchronize()


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Launch the accumulated lazy-mode graph (``htcore.mark_step()``); with ``sync``, then wait
    for the card. Afterwards the step closures queued by ``htcore.add_step_closure`` run, in
    the order they were queued (lazy mode), as Intel's ``mark_step`` runs them."""
    dev = get_device()
    dev.launch("mark_step")
    if sync:
        dev.synchronize()
    _run_step_closures()


_step_closures: list = []
_step_closures_lock = threading.Lock()


def _add_step_closure(closure, args: tuple = ()) -> None:
    """Queue ``closure(*args)`` to run after the next ``mark_step`` (``htcore.add_step_closure``).

    Raises:
        TypeError: ``closure`` is not callable, or ``args`` is not a tuple or list.
    """
    if not callable(closure):
        raise TypeError(f"add_step_closure: closure must be callable, got {type(closure).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"add_step_closure: args must be a tuple of the closure's arguments, got "
                        f"{type(args).__name__}")
    with _step_closures_lock:
        _step_closures.append((closure, tuple(args)))


def _run_step_closures() -> None:
    """Run and clear the queued step closures (a closure that queues another queues it for the
    next step, as on Gaudi: the queue is taken before any runs)."""
    with _step_closures_lock:
        if not _step_closures:
            return
        todo = _step_closures[:]
        _step_closures.clear()
    for closure, args in todo:
        closure(*args)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported() -> bool:
    return True


# ---- memory ---------------------------------------------------------------------------------
def memory_allocated(device: object = None) -> int:
    """Bytes of tensors resident on the simulated HBM now."""
    return get_device().hbm.live_bytes


def max_memory_allocated(device: object = None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return get_device().hbm.peak_bytes


def reset_peak_memory_stats(device: object = None) -> None:
    """Set the peak to the current allocation."""
    get_device().hbm.reset_peak()


def reset_accumulated_memory_stats(device: object = None) -> None:
    """Clear ``NumAllocs`` and ``NumFrees`` of :func:`memory_stats` (Gaudi's
    ``torch.hpu.memory.reset_accumulated_memory_stats``); ``InUse``, ``MaxInUse`` and
    ``ActiveAllocs`` stay."""
    get_device().hbm.reset_accumulated()


def mem_get_info(device: object = None) -> tuple[int, int]:
    """``(free_bytes, total_bytes)`` of the simulated HBM."""
    return get_device().hbm.mem_get_info()


def memory_stats(device: object = None) -> dict[str, int]:
    """Gaudi-style statistics: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize."""
    return get_device().hbm.stats().as_dict()


def memory_summary(device: object = None) -> str:
    """The :func:`memory_stats` dictionary as a two-column text table (bytes)."""
    from tabulate import tabulate

    return tabulate(sorted(memory_stats(device).items()), headers=["statistic", "bytes"], intfmt=",")


# ---- dynamic shapes ---------------------------------------------------------------------------
_dynamic_shapes = True


def enable_dynamic_shape() -> None:
    """Gaudi's dynamic-shape support on (recorded; see :func:`get_dynamic_shape_status`)."""
    global _dynamic_shapes
    _dynamic_shapes = True


def disable_dynamic_shape() -> None:
    """Gaudi's dynamic-shape support off (recorded only: here a new input shape is a new graph
    key and a recipe-cache miss whatever this flag says)."""
    global _dynamic_shapes
    _dynamic_shapes = False


def get_dynamic_shape_status() -> bool:
    """The last value set by :func:`enable_dynamic_shape` / :func:`disable_dynamic_shape`."""
    return _dynamic_shapes


# ---- random numbers: the card's generator is the host generator (tensors live on the host) ---
def manual_seed(seed: int) -> None:
    """Seed the card's generator (``torch.manual_seed``: one generator, see above)."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every card of this process (one); transformers' ``set_seed`` calls it."""
    torch.manual_seed(seed)


def seed() -> None:
    """Seed from a non-deterministic source."""
    torch.seed()


def seed_all() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(device: object = "hpu") -> torch.Tensor:
    """The generator state as a uint8 tensor."""
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: object = "hpu") -> None:
    torch.set_rng_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    """Raises: ValueError: not exactly one state (one card per process)."""
    if len(new_states) != 1:
        raise ValueError(f"set_rng_state_all: this process has 1 card, got {len(new_states)} states")
    torch.set_rng_state(new_states[0])


# ---- autocast ---------------------------------------------------------------------------------
def is_autocast_hpu_enabled() -> bool:
    """Whether the calling thread is inside an enabled ``torch.autocast("hpu")`` region."""
    return amp.hpu_region() is not None


def get_autocast_hpu_dtype() -> torch.dtype:
    """The lower-precision dtype of the innermost ``"hpu"`` autocast region (bf16 outside one)."""
    region = amp.hpu_region()
    return torch.bfloat16 if region is None else region


# ---- streams and events (see NOTE [streams and events]) --------------------------------------
class Stream(torch.Stream):
    """A stream of the simulated card (see NOTE [streams and events]): a ``torch.Stream`` of device
    ``hpu:0``, as Gaudi's is (``tensor.record_stream(s)``, DeepSpeed's ZeRO-3 does it, accepts it).

    ``Stream(device=None, priority=0)``: ``device`` is unused (one card per process, as on Gaudi);
    torch's own form ``Stream(stream_id=..., device_index=..., device_type=...)`` names an
    existing stream.

    Attributes:
        stream_id: 0 for the default stream, a new positive id for each ``Stream()`` (the
            device type's stream ids, ``hpu_runtime/bridge/csrc/hpu_device.cpp``).
        priority: as given (every stream has the same priority here).
    """

    def __new__(cls, device: object = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device="hpu", priority=priority)

    def __init__(self, device: object = None, priority: int = 0, **_kwargs) -> None:
        self.priority = priority

    def synchronize(self) -> None:
        """Launch pending work; the host waits for the compute stream."""
        dev = get_device()
        with dev.lock:
            dev.launch("stream_synchronize")
            dev.wait_host(dev.compute.free_ns)

    def query(self) -> bool:
        """Whether all work issued so far is done (nothing pending, the host past it)."""
        dev = get_device()
        return not dev.pending and dev.host_ns >= dev.compute.free_ns

    def wait_stream(self, other: torch.Stream) -> None:
        """Accepted: every stream's work runs in order on the one compute queue."""

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event(enable_timing=True)
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<hpu.Stream stream_id={self.stream_id} priority={self.priority}>"


@functools.cache
def _default_stream() -> Stream:
    """The default stream, made at first use (the device type is registered by then)."""
    return Stream(stream_id=0, device_index=0, device_type=torch.accelerator.current_stream().device_type)


_current = threading.local()


def current_stream(device: object = None) -> Stream:
    """The calling thread's current stream (the default stream unless one was selected)."""
    s = getattr(_current, "stream", None)
    return _default_stream() if s is None else s


def default_stream(device: object = None) -> Stream:
    """The default stream (``stream_id`` 0)."""
    return _default_stream()


def set_stream(s: Stream) -> None:
    """Make ``s`` the calling thread's current stream."""
    _current.stream = s


@contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """``with hpu.stream(s):``: ``s`` is the current stream inside the block (None: unchanged)."""
    if s is None:
        yield s
        return
    prev = current_stream()
    set_stream(s)
    try:
        yield s
    finally:
        set_stream(prev)


class Event:
    """A point on the simulated compute stream, with simulated timing."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.time_ns: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Launch pending work and stamp when the compute stream reaches this point."""
        dev = get_device()
        with dev.lock:
            dev.launch("event_record")
            self.time_ns = max(dev.compute.free_ns, dev.host_ns)

    def synchronize(self) -> None:
        """The host waits until the event's point."""
        self._check()
        get_device().wait_host(self.time_ns)

    def wait(self, stream: Stream | None = None) -> None:
        """Later device work waits for this event."""
        self._check()
        get_device().stream_wait(self.time_ns)

    def query(self) -> bool:
        return self.time_ns is not None and get_device().host_ns >= self.time_ns

    def elapsed_time(self, end_event: Event) -> float:
        """Simulated milliseconds from this event to ``end_event``.

        Raises:
            RuntimeError: if either event was not recorded.
        """
        self._check()
        end_event._check()
        return (end_event.time_ns - self.time_ns) / 1e6

    def _check(self) -> None:
        if self.time_ns is None:
            raise RuntimeError("hpu.Event: the event has not been recorded")
