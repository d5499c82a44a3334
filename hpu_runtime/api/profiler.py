"""``torch.profiler`` with ``ProfilerActivity.HPU``: the simulated Gaudi's lanes in PyTorch's own traces.

Intel's "Profiling with PyTorch" recipe is::

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(DIR)) as prof:
        for batch in loader: train_step(batch); prof.step()

On a Gaudi, Habana's Kineto plugin adds the device's activity. Here :func:`install` (called by
``import hpu_runtime``) makes ``HPU`` a supported activity, puts :class:`ProfilerActivity` at
``torch.profiler.ProfilerActivity`` as ``habana_frameworks`` does, and for each profiled window it
keeps the simulated device's spans (:meth:`SimDevice.enable_trace`) and adds them to what
PyTorch produces:

* ``export_chrome_trace`` / ``tensorboard_trace_handler`` write Kineto's JSON (CPU ops as
  usual) plus one process "HPU <rank> (simulated Gaudi)" with three lanes: ``host`` (tid 0:
  the bridge's host work: op accumulation, graph launch, compile, copies), ``compute stream``
  (tid 1: each launched graph or op) and ``collective stream`` (tid 2: each collective, its
  ``bytes`` and algorithm in ``args``). Device events are Kineto's ``"cat": "kernel"`` with
  ``args.stream`` and ``args.device``, as the TensorBoard plugin, Perfetto and Holistic
  Trace Analysis read device kernels.
* ``key_averages()`` / ``table()`` gain one event per compute- and collective-stream span,
  so the device time columns ("HPU time") hold simulated device time. Their ``device_type``
  is ``PrivateUse1``: torch 2.13's ``table()`` sums device time only for CUDA, PrivateUse1,
  MTIA and XPU events (an HPU one trips its consistency check).

NOTE [the time axis of the device lanes]
Device spans are simulated ns since the device's start; Kineto's CPU events are wall-clock
µs. A device span at simulated ``t`` is placed at ``first CPU event + (t - t0) / 1000`` µs,
``t0`` being the simulated host clock when the window opened: both lanes start together and
the device lanes keep simulated durations (the CPU lanes keep wall-clock ones; the two do not
line up event for event, and are not meant to). The process name says "simulated time".

NOTE [launch events]
Each device event has a zero-length ``hpuLaunch`` event (``"cat": "cuda_runtime"``) on the
host lane with the same ``args.correlation``: the link Kineto draws from a launch to its
kernel, by which HTA keeps a kernel and gives it its iteration. A launch is a host (wall-clock)
event, so it sits 1 µs into the ``ProfilerStep#k`` annotation of the step whose simulated
interval (between the simulated host times of two ``prof.step()`` calls) holds the kernel;
the kernel stays on the simulated axis.

NOTE [the user's frames, not the emulator's]
What the profiler hands the user holds what a Gaudi run's would (NOTE [the emulator's own work
is not the user's profile] in :mod:`hpu_runtime.bridge.dispatch`): :func:`user_events` removes
from the exported trace every Python frame (``with_stack=True``) of the emulator's packages
(``hpu_runtime``, ``hccl``; the ``habana_frameworks`` API a script calls stays) and the frames
of libraries they call (torch, the standard library, installed packages), up to the next frame
of the user's code (the script's own files, ``nn.Module`` calls): the module calls of a model
an HPU-graph wrapper runs while it captures stay, under the nearest frame kept.
``PythonDispatchMode`` events (torch's, on entering a dispatch mode, which the bridge was until
it moved into the hpu kernel) go from the trace and from ``key_averages()``; the user's op
keeps its time.

NOTE [collective names for Holistic Trace Analysis]
HTA recognises communication kernels by name only (``^nccl.*Kernel``) and treats every
other device kernel as computation. Collective-stream events are therefore named
``ncclKernel <kind> (hccl, simulated)``, e.g. ``ncclKernel allreduce (hccl, simulated)``,
so its communication/computation overlap and idle-time analyses classify them; the label the
emulator gives the collective (``allreduce #3``) is in ``args.label``.
"""

from __future__ import annotations

import bisect
import enum
import importlib.util
import json
import os
import re
import sys
import sysconfig
from pathlib import Path

import torch
from torch.autograd import profiler as _autograd_profiler
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import DeviceType
from torch.profiler import ProfilerActivity as _CActivity

from ..bridge.runtime import get_device
from ..device.timeline import TraceEvent
from ..files import atomic_write

__all__ = ["LANES", "ProfilerActivity", "install", "device_events", "user_events"]

LANES = {"host": 0, "compute": 1, "collective": 2}
"""Thread id of each device lane in the exported trace."""

_LANE_NAMES = {"host": "host (simulated)", "compute": "compute stream", "collective": "collective stream"}
_PID_BASE = 1 << 20  # above any real pid Kineto writes
_CORRELATION_BASE = 1 << 28  # above the correlation ids Kineto gives a short run, within HTA int32
_installed = False


class ProfilerActivity(enum.Enum):
    """``torch.profiler.ProfilerActivity`` as ``habana_frameworks`` installs it: a Python enum
    whose members equal (and hash as) torch's own, so ``activities=[ProfilerActivity.CPU,
    ProfilerActivity.HPU]`` and ``X in torch.profiler.supported_activities()`` work as before.
    lightning-habana's ``HPUProfiler`` checks for this patch ("lightning_habana should be
    imported before lightning"); ``torch.profiler.profile`` gets torch's members back."""

    CPU = _CActivity.CPU
    XPU = _CActivity.XPU
    MTIA = _CActivity.MTIA
    CUDA = _CActivity.CUDA
    HPU = _CActivity.HPU
    PrivateUse1 = _CActivity.PrivateUse1

    def __eq__(self, other) -> bool:
        return self.value == (other.value if isinstance(other, ProfilerActivity) else other)

    def __hash__(self) -> int:
        return hash(self.value)


def _c_activity(a):
    return a.value if isinstance(a, ProfilerActivity) else a


def _c_activities(init):
    """``init`` with ``activities`` given back as torch's own members."""
    def __init__(self, *args, activities=None, **kwargs):
        if activities is not None:
            activities = [_c_activity(a) for a in activities]
        init(self, *args, activities=activities, **kwargs)

    __init__.__wrapped__ = init
    return __init__


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _kernel_name(e: TraceEvent) -> str:
    if e.stream == "collective":
        kind = e.args.get("kind") or e.name.split(" #")[0]
        return f"ncclKernel {kind} (hccl, simulated)"  # NOTE [collective names for Holistic Trace Analysis]
    return e.name


def device_events(spans: list[TraceEvent], t0_ns: int, base_us: float, rank: int,
                  step_ends_ns: list[int] = (), step_starts_us: list[float] = ()) -> list[dict]:
    """Kineto-format JSON events of the simulated device's ``spans`` (see the module docstring).

    Args:
        spans: the window's spans (simulated ns).
        t0_ns: simulated host time when the window opened.
        base_us: trace time (µs) the device lanes start at.
        rank: the process's rank (the device index and the process row).
        step_ends_ns: simulated host time at each ``prof.step()`` of the window, in order.
        step_starts_us: trace time of each ``ProfilerStep#`` annotation, in order (NOTE [launch events]).
    """
    pid = _PID_BASE + rank
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"HPU {rank} (simulated Gaudi, simulated time)"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": f"HPU {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    for lane, tid in LANES.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": _LANE_NAMES[lane]}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for i, e in enumerate(spans):
        ts = base_us + (e.start_ns - t0_ns) / 1000.0
        args = {"device": rank, "simulated_start_ns": e.start_ns, "simulated_dur_ns": e.dur_ns, **dict(e.args)}
        if e.stream == "host":
            out.append({"ph": "X", "cat": "cpu_op", "name": e.name, "pid": pid, "tid": 0, "ts": ts,
                        "dur": e.dur_ns / 1000.0, "args": _json(args)})
            continue
        corr = _CORRELATION_BASE + i
        args.update(stream=LANES[e.stream], correlation=corr)
        if e.stream == "collective":
            args["label"] = e.name
        out.append({"ph": "X", "cat": "kernel", "name": _kernel_name(e), "pid": pid, "tid": LANES[e.stream],
                    "ts": ts, "dur": e.dur_ns / 1000.0, "args": _json(args)})
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "hpuLaunch", "pid": pid, "tid": 0,
                    "ts": _launch_us(e.start_ns, ts, step_ends_ns, step_starts_us), "dur": 0.0,
                    "args": {"correlation": corr, "device": rank}})
    return out


_FRAME = re.compile(r"^(.*)\((\d+)\): ")
_MODULE_CALLS = (": _call_impl", ": _wrapped_call_impl")
_BRIDGE_INDUCED = {"torch/_library/simple_registry.py"}
"""torch's Python it runs only because a dispatch mode is on (its per-op lookup of a mode's
dispatch rules): on a Gaudi there is none, nor is the bridge one now (NOTE [the bridge in the
kernel] in :mod:`hpu_runtime.bridge.dispatch`)."""
_DISPATCH_EVENT = "PythonDispatchMode"


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return os.path.realpath(locations[0]) + os.sep if locations else None


class _Frames:
    """Which side a Python frame of a trace is on: ``"ours"`` (the emulator), ``"user"`` (the
    script and its own modules, the ``habana_frameworks`` API it calls, ``nn.Module`` calls) or
    ``"lib"`` (torch's other code, the standard library, installed packages, built-ins: the
    side of their caller, so numpy under the planner goes and torchvision's ``forward`` under
    a module call stays).
    Kineto names a frame ``FILE(LINE): FUNC``, ``FILE`` absolute or relative to its entry of
    ``sys.path``."""

    def __init__(self) -> None:
        here = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))  # hpu_runtime/
        self.ours = tuple(d for d in (here + os.sep, _package_dir("hccl")) if d)
        self.shim = os.path.join(here, "api", "habana_frameworks") + os.sep
        self.torch = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
        paths = sysconfig.get_paths()
        self.stdlib = os.path.realpath(paths["stdlib"]) + os.sep
        self.libs = tuple(dict.fromkeys(
            [self.stdlib] + [os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib")]
            + [os.path.realpath(d) + os.sep for d in sys.path if os.path.basename(d) in ("site-packages", "dist-packages")]))
        self.memo: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        m = _FRAME.match(name)
        if m is None:
            return "lib"  # <built-in method ...>
        f = m.group(1)
        kind = self.memo.get(f)
        if kind is None:
            kind = self.memo[f] = self._kind(f)
        if kind == "module":  # a module's call is the user's model; its other methods are torch's
            return "user" if name.endswith(_MODULE_CALLS) else "lib"
        return kind

    def _kind(self, f: str) -> str:
        rel = f.replace(os.sep, "/")
        if os.path.isabs(f):
            path = os.path.realpath(f)
            if path.startswith(self.shim):
                return "user"
            if path.startswith(self.ours):
                return "ours"
            if path.startswith(self.torch):
                rel = "torch/" + path[len(self.torch):].replace(os.sep, "/")
            else:
                return "lib" if path.startswith(self.libs) else "user"
        if rel.startswith("hpu_runtime/api/habana_frameworks/") or rel.startswith("habana_frameworks/"):
            return "user"
        if rel.startswith(("hpu_runtime/", "hccl/")):
            return "ours"
        if rel in _BRIDGE_INDUCED:
            return "ours"
        if rel.startswith("torch/"):
            return "module" if rel == "torch/nn/modules/module.py" else "lib"
        if rel.startswith("<") or any(os.path.exists(os.path.join(d, f)) for d in self.libs):
            return "lib"  # the standard library, an installed package (numpy, PIL, torchvision...)
        return "user"


def _emulator_frames(frames) -> tuple[set[int], dict[int, int | None]]:
    """The Python frames to drop (NOTE [the user's frames, not the emulator's]) among ``frames``,
    ``(Python id, Python parent id, name)`` triples, and for each frame kept whose caller is
    dropped, the nearest caller kept (None: none)."""
    kind_of = _Frames()
    frames = sorted(frames)  # a caller's id is below its callees'
    side: dict[int, str | None] = {}  # the nearest ours/user frame at or above each frame
    up: dict[int, int | None] = {}  # each frame's nearest kept caller
    dropped: set[int] = set()
    moved: dict[int, int | None] = {}
    for pid, parent, name in frames:
        kind = kind_of(name)
        side[pid] = kind if kind != "lib" else side.get(parent)
        nearest = up.get(parent) if parent in dropped else parent
        if side[pid] == "ours":
            dropped.add(pid)
        elif parent in dropped:
            moved[pid] = nearest
        up[pid] = nearest
    return dropped, moved


def user_events(events: list[dict]) -> list[dict]:
    """``events`` (a Kineto trace's ``traceEvents``) without the emulator's own Python frames
    and ``PythonDispatchMode`` events (NOTE [the user's frames, not the emulator's]). A frame
    kept whose caller went is re-parented (``Python parent id``) to its nearest caller kept."""
    py = {e["args"]["Python id"]: e for e in events
          if e.get("cat") == "python_function" and isinstance(e.get("args"), dict) and "Python id" in e["args"]}
    dropped, moved = _emulator_frames((i, e["args"].get("Python parent id"), e["name"]) for i, e in py.items())
    for i, parent in moved.items():
        py[i]["args"]["Python parent id"] = parent
    return [e for e in events
            if not (e.get("cat") == "python_function" and e.get("args", {}).get("Python id") in dropped)
            and not (e.get("cat") == "cpu_op" and e.get("name") == _DISPATCH_EVENT)]


def _drop_emulator_events(function_events) -> None:
    """Remove the emulator's Python frames and ``PythonDispatchMode`` events from
    ``function_events`` (an ``EventList``, in place), as :func:`user_events` does from a trace:
    their children go to the nearest event kept above them, so each user op's self time holds
    the bridge's host time for it (NOTE [the user's frames, not the emulator's])."""
    py = [e for e in function_events if e.is_python_function and e.python_id is not None]
    dropped, moved = _emulator_frames((e.python_id, e.python_parent_id, e.name) for e in py)
    for e in py:
        if e.python_id in moved:
            e.python_parent_id = moved[e.python_id]
    gone = {id(e) for e in function_events
            if e.name == _DISPATCH_EVENT or (e.is_python_function and e.python_id in dropped)}
    if not gone:
        return
    for e in function_events:
        if id(e) in gone:
            continue
        parent = e.cpu_parent
        while parent is not None and id(parent) in gone:
            parent = parent.cpu_parent
        if parent is not e.cpu_parent:
            e.cpu_parent = parent
            if parent is not None:
                parent.cpu_children.append(e)
        e.cpu_children[:] = [c for c in e.cpu_children if id(c) not in gone]
    function_events[:] = [e for e in function_events if id(e) not in gone]


def _launch_us(start_ns: int, ts_us: float, step_ends_ns, step_starts_us) -> float:
    """Trace time of a device event's launch: inside the ``ProfilerStep#`` whose simulated step holds
    it (NOTE [launch events]); without profiler steps, the event's own time."""
    if not step_starts_us:
        return ts_us
    k = min(bisect.bisect_right(step_ends_ns, start_ns), len(step_starts_us) - 1)
    return step_starts_us[k] + 1.0


def _json(args: dict) -> dict:
    return json.loads(json.dumps(args, default=str))


def _start(prof) -> None:
    dev = get_device()
    owned = dev.card.trace is None
    dev.enable_trace()
    prof._hpu_window = {"owned": owned, "first": len(dev.card.trace), "t0_ns": dev.host_ns, "spans": None,
                        "steps": []}


def _stop(prof) -> None:
    window = getattr(prof, "_hpu_window", None)
    if window is None or window["spans"] is not None:
        return
    dev = get_device()
    dev.synchronize()
    window["spans"] = dev.trace_events(_rank())[window["first"]:]
    if window["owned"]:
        dev.disable_trace()


def _first_cpu_ts(events: list[dict]) -> float:
    times = [e["ts"] for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    return min(times) if times else 0.0


def install() -> None:
    """Make ``ProfilerActivity.HPU`` profile the simulated Gaudi (idempotent; see the module doc)."""
    global _installed
    if _installed:
        return
    _installed = True
    ap = _autograd_profiler
    supported = ap._supported_activities
    ap._supported_activities = lambda: set(supported()) | {_CActivity.HPU}
    for kind in (torch.profiler.profiler._KinetoProfile, torch.profiler.profile):
        kind.__init__ = _c_activities(kind.__dict__["__init__"])
    torch.profiler.ProfilerActivity = ProfilerActivity
    cls = ap.profile
    start, exit_, export, ensure = cls._start_trace, cls.__exit__, cls.export_chrome_trace, cls._ensure_function_events

    def _hpu(self) -> bool:
        return _CActivity.HPU in getattr(self, "kineto_activities", ())

    def _start_trace(self):
        if _hpu(self):
            _start(self)
        return start(self)

    def __exit__(self, *exc):
        if _hpu(self):
            _stop(self)
        return exit_(self, *exc)

    def export_chrome_trace(self, path, metadata=None, use_python_export=False):
        window = getattr(self, "_hpu_window", None)
        # Kineto writes in place: it writes a temporary file here, and the user's trace (NOTE
        # [the user's frames, not the emulator's]) with the device lanes replaces ``path`` whole
        # (NOTE [atomic files] in hpu_runtime.files)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.kineto.tmp")
        try:
            result = export(self, str(tmp), metadata, use_python_export)
            trace = json.loads(tmp.read_text())
        finally:
            tmp.unlink(missing_ok=True)
        events = trace["traceEvents"] = user_events(trace.get("traceEvents", []))
        if window and window["spans"] is not None:
            steps = sorted(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
            events.extend(device_events(window["spans"], window["t0_ns"], _first_cpu_ts(events), _rank(),
                                        window["steps"], steps))
            trace.setdefault("deviceProperties", []).append(
                {"id": _rank(), "name": f"simulated {get_device().spec.name}"})
        atomic_write(path, json.dumps(trace))
        return result

    def _ensure_function_events(self):
        fresh = self._function_events is None
        ensure(self)
        if fresh and self._function_events is not None:
            _drop_emulator_events(self._function_events)
        window = getattr(self, "_hpu_window", None)
        if not window or window["spans"] is None or window.get("added") or self._function_events is None:
            return
        window["added"] = True
        base = min((e.time_range.start for e in self._function_events), default=0)
        for i, e in enumerate(window["spans"]):
            if e.stream == "host":
                continue
            begin = base + (e.start_ns - window["t0_ns"]) / 1000.0
            self._function_events.append(FunctionEvent(
                id=-(i + 1), name=_kernel_name(e), thread=LANES[e.stream], start_us=begin,
                end_us=begin + e.dur_ns / 1000.0, stack=[], input_shapes=[], use_device="hpu",
                device_type=DeviceType.PrivateUse1, device_index=_rank()))

    step = torch.profiler.profile.step

    def step_(self):
        window = getattr(getattr(self, "profiler", None), "_hpu_window", None)
        if window is not None and window["spans"] is None:
            window["steps"].append(get_device().host_ns)
        return step(self)

    for new, old in ((_start_trace, start), (__exit__, exit_), (export_chrome_trace, export),
                     (_ensure_function_events, ensure), (step_, step)):
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
    torch.profiler.profile.step = step_
    cls._start_trace, cls.__exit__ = _start_trace, __exit__
    cls.export_chrome_trace, cls._ensure_function_events = export_chrome_trace, _ensure_function_events
