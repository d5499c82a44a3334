"""The ``hpu`` device type of the simulated Gaudi: a small C++ extension, built once and loaded at import.

NOTE [a device type for the simulated Gaudi]
A tensor on the simulated card is a tensor of torch's own ``hpu`` device type: it says
``device(type='hpu', index=0)`` wherever a script or torch looks (``.device``, parameters,
optimizer state, ``state_dict``, DTensor's local tensors, FSDP2's device checks, autograd's
input metadata), and ``.cpu()`` / ``.to("cpu")`` copy it to a CPU tensor, as on Gaudi. Its
storage is an ordinary CPU storage and its ops run torch's CPU kernels, so numerics are
those of CPU tensors. ``csrc/hpu_device.cpp`` registers, for the ``HPU`` dispatch key and
device type, what the CPU wheel lacks:

* a boxed kernel for every op (the fallback of the ``HPU`` key, and the direct ``HPU``
  kernel of every aten op that has a CPU kernel): it swaps each hpu argument for a CPU view
  (a second TensorImpl over the same storage: no copy), redispatches to the CPU kernel and
  hands back hpu tensors: the argument itself when the op returns it (in place, ``out=``),
  new tensors turned hpu in place (views keep the storage they share), CPU arguments and
  results asked for with ``device="cpu"`` left CPU. A mutating op that resized or re-pointed
  a view (``out=``, ``resize_``, ``set_``) has its metadata copied back. Nested tensor lists
  are handled, so c10d's own ops work: gloo moves hpu tensors as their CPU views;
* ``empty`` and ``empty_strided`` (CPU memory, hpu tensors) and ``copy_`` between hpu and CPU;
  ``record_stream`` does nothing (one compute queue, NOTE [streams and events] in
  :mod:`hpu_runtime.api.hpu`);
* a DeviceGuardImpl (one card, ``hpu:0``; streams are ids, events no-ops) and the
  accelerator hooks (``at::HPUHooksInterface``: ``torch.accelerator`` is hpu, pinned memory
  is host memory, the CPU generator is the card's), which autograd and torch.distributed need;
* the bridge's hooks around each of those ops, and around the host's ``_to_copy`` to ``hpu``
  (NOTE [the bridge in the kernel] in :mod:`hpu_runtime.bridge.dispatch`), with the C switches
  the bridge sets them through (``ctypes``);
* ``torch.ops.hpu_sim.cpu_view``: the zero-copy CPU view, for hccl's transport (:func:`cpu_view`);
* DDP's timer for the device type (``c10d::TimerRegistry``, host timestamps, as Habana's hccl
  library registers one for ``kHPU``): DDP's runtime stats in ``_get_ddp_logging_data()``, and
  no "Time stats are currently only collected for CPU and CUDA devices" warning per rank.

The bridge's hooks, which this kernel calls (NOTE [the bridge in the kernel] in
:mod:`hpu_runtime.bridge.dispatch`), are the only Python step per op; the C++ hop adds
0.3-0.5 us per op (``python -m hpu_runtime.tools.bench_device_type``). Rejected (measured
there): a Python wrapper subclass (twice the bridge's whole per-op cost), and a Python
``Tensor.device`` that says hpu over CPU tensors (DTensor and C++ code would still see CPU).

With a guard registered, autograd runs backward of hpu tensors on a device thread of its
own; :func:`hpu_runtime.bridge.dispatch.activate` keeps backward on the training thread
(``torch.autograd.set_multithreading_enabled(False)``), as it ran on CPU tensors, so the
bridge's thread-local state (autocast regions) applies and ops are charged in one order.

Build: :func:`install` compiles the extension with ``torch.utils.cpp_extension`` (g++ and
ninja) the first time a process on a machine imports ``hpu_runtime``, under a name that
hashes the sources and torch's version, into torch's build folder for extensions
(``$TORCH_EXTENSIONS_DIR`` if set, else torch's per-user cache), or, where that cannot be
created (a read-only home), a per-user folder in the temporary directory (:func:`library_path`). A file
lock makes concurrent first imports (``pytest -n auto`` workers, torchrun's ranks) build it
once while the others wait; a marker written after the build finished tells a complete
library from one a killed build left behind. Later imports load it (about 10 ms). No
compiler at that first import is an error naming what is missing: tensors that said ``cpu``
instead would take other code paths in the very scripts (``device.type == "hpu"``, FSDP2)
the emulator is meant to check.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

__all__ = ["DeviceTypeBuildError", "cpu_view", "install", "library", "library_path"]

_SOURCES = tuple(Path(__file__).with_name("csrc") / f for f in ("hpu_device.cpp", "hpu_autocast.cpp"))
_CFLAGS = ("-O2", "-DNDEBUG")
"""The compiler's flags for the library (part of its name, so a change builds it anew). ``NDEBUG``
as a setuptools build of an extension sets it (Python's own ``CFLAGS``) and as torch is built:
without it, the inline code of the headers checks more than torch's own build does, pybind11's
above all, which asks the interpreter whether this thread holds the GIL at every reference count
it changes (``PYBIND11_ASSERT_GIL_HELD_INCREF_DECREF``, set by
``pybind11/detail/common.h`` when ``NDEBUG`` is not): about 4% of an op's time in lazy mode,
measured with ``perf`` on ``x.add_(y)``."""
_LOCK_TIMEOUT_S = 900.0
"""How long :func:`install` waits for another process's build of the same library (seconds)."""

_loaded: Path | None = None
_cpu_view = None  # torch.ops.hpu_sim.cpu_view.default, once installed


class DeviceTypeBuildError(RuntimeError):
    """The ``hpu`` device type's C++ extension could not be built or loaded."""


def _name() -> str:
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES) + torch.__version__.encode()
                            + " ".join(_CFLAGS).encode()).hexdigest()[:12]
    return f"hpu_runtime_device_{digest}"


def _extensions_root() -> Path:
    """torch's folder for built extensions: ``$TORCH_EXTENSIONS_DIR``, else
    ``<torch's per-user cache>/torch_extensions/py3X_<accelerator>`` (the rule of
    ``torch.utils.cpp_extension._get_build_directory``, torch 2.13). Computed here rather than
    by importing ``torch.utils.cpp_extension``, which imports setuptools, for one path: that
    was about 0.04 s of CPU of every process that imports ``hpu_runtime`` (every rank, every
    test process; ``import hpu_runtime`` after ``import torch``, 0.19-0.20 s before, 0.15-0.16 s
    after, on 2 cores); the module is imported only to build."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root)
    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    from torch._appdirs import user_cache_dir  # a small module (torch's copy of appdirs)

    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(os.path.realpath(user_cache_dir(appname="torch_extensions"))) / f"{python}_{accelerator}"


def library_path() -> Path:
    """Where the built library is (or will be): ``<build folder>/<name>.so``, the build folder
    being torch's for an extension of that name (``$TORCH_EXTENSIONS_DIR/<name>``, else
    ``<torch's per-user cache>/py3X_cpu/<name>``: :func:`_extensions_root`), created if
    missing, or, where that cannot be created (a read-only home),
    ``<temporary directory>/hpu_runtime_extensions_<uid>/<name>``."""
    name = _name()
    folder = _extensions_root() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"hpu_runtime_extensions_{os.getuid()}" / name
    return folder / f"{name}.so"


def _built(so: Path) -> Path:
    """The marker :func:`install` writes once ``so`` is completely built."""
    return so.with_suffix(".built")


def _missing_tools() -> list[str]:
    from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available

    missing = []
    if shutil.which(get_cxx_compiler()) is None:
        missing.append(f"a C++ compiler ({get_cxx_compiler()!r}, e.g. apt-get install g++)")
    if not is_ninja_available():
        missing.append("ninja (pip install ninja)")
    return missing


def _build(so: Path) -> None:
    from torch.utils.cpp_extension import load

    missing = _missing_tools()
    if missing:
        raise DeviceTypeBuildError(
            f"hpu_runtime: building the simulated Gaudi's 'hpu' device type (bridge/csrc, once per machine and"
            f" torch version, into {so.parent}) needs {' and '.join(missing)}; none found")
    so.parent.mkdir(parents=True, exist_ok=True)
    (so.parent / "lock").unlink(missing_ok=True)  # a crashed build's baton: we hold the real lock
    try:
        load(so.stem, [str(p) for p in _SOURCES], build_directory=str(so.parent), extra_cflags=list(_CFLAGS), is_python_module=False)
    except Exception as exc:  # noqa: BLE001 - the compiler's own message says why
        raise DeviceTypeBuildError(f"hpu_runtime: building the 'hpu' device type failed: {exc}") from None


def install() -> Path:
    """Make ``hpu`` tensors work in this process (idempotent); returns the library's path.

    Loads the built library, building it first if this machine has not (see NOTE [a device
    type for the simulated Gaudi]).

    Raises:
        DeviceTypeBuildError: no C++ compiler or ninja for the first build, no writable build
            folder, a failed build, a library that does not load, or another process's build
            not finished within 900 s.
    """
    global _loaded, _cpu_view
    if _loaded is not None:
        return _loaded
    from filelock import FileLock, Timeout

    so = library_path()
    if not _built(so).is_file():
        try:
            so.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DeviceTypeBuildError(f"hpu_runtime: cannot create the 'hpu' device type's build folder"
                                       f" {so.parent} ({exc}); set TORCH_EXTENSIONS_DIR to a writable"
                                       f" folder") from None
        lock = FileLock(str(so.parent.parent / f"{so.stem}.lock"))
        try:
            with lock.acquire(timeout=_LOCK_TIMEOUT_S):
                if not _built(so).is_file():
                    _build(so)
                    _built(so).write_text(torch.__version__ + "\n")
        except Timeout:
            raise DeviceTypeBuildError(f"hpu_runtime: another process has held {lock.lock_file} for more than"
                                       f" {_LOCK_TIMEOUT_S:.0f} s building the 'hpu' device type") from None
    if not hasattr(torch.ops.hpu_sim, "cpu_view"):
        try:
            torch.ops.load_library(str(so))
        except OSError as exc:
            raise DeviceTypeBuildError(f"hpu_runtime: cannot load the 'hpu' device type ({exc}); delete"
                                       f" {so.parent} to rebuild it") from None
    _cpu_view = torch.ops.hpu_sim.cpu_view.default
    _fake_strides_as_the_kernels_make_them()
    _loaded = so
    return so


_library = None  # the loaded library's C functions (ctypes), once installed


def library():
    """The library's C functions, through ``ctypes.PyDLL`` (called with the GIL held), with their
    signatures declared: the bridge's switches (``hpu_sim_set_hooks``, ``hpu_sim_set_active``,
    ``hpu_sim_hooks_on``, ``hpu_sim_inside``: NOTE [the bridge in the kernel] in
    :mod:`hpu_runtime.bridge.dispatch`), ``hpu_sim_set_device`` (the current device's HBM counters,
    accounting and ``OpRecord`` type, for the kernel's own check before an op and its own op
    record: NOTE [an op's entry, kept by the kernel], NOTE [the op record, in the kernel]) and
    ``hpu_sim_builtins`` (:func:`builtins`). Installs it first.

    Raises:
        DeviceTypeBuildError: as :func:`install`.
    """
    global _library
    if _library is None:
        import ctypes

        lib = ctypes.PyDLL(str(install()))
        lib.hpu_sim_set_hooks.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object]
        lib.hpu_sim_set_hooks.restype = None
        lib.hpu_sim_set_active.argtypes = [ctypes.c_int]
        lib.hpu_sim_set_active.restype = None
        lib.hpu_sim_hooks_on.argtypes = []
        lib.hpu_sim_hooks_on.restype = ctypes.c_int
        lib.hpu_sim_inside.argtypes = [ctypes.c_int]
        lib.hpu_sim_inside.restype = None
        lib.hpu_sim_set_device.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object]
        lib.hpu_sim_set_device.restype = None
        lib.hpu_sim_builtins.argtypes = []
        lib.hpu_sim_builtins.restype = ctypes.py_object
        _library = lib
    return _library


_builtins: dict | None = None


def builtins() -> dict:
    """The library's builtin functions (called like Python functions, at the cost of a C call),
    by name: ``storage_io`` (NOTE [an op's storages, in the kernel library] in
    :mod:`hpu_runtime.bridge.op_accounting`); the HBM counters' ``hbm`` (:class:`~hpu_runtime.device.memory.HBMModel`);
    ``residency_register`` and ``residency_on_free``
    (:class:`~hpu_runtime.device.residency.Residency`); ``launcher_append``
    (:meth:`~hpu_runtime.bridge.launcher.Launcher.append_op`); the class ``DeviceLock``, the
    device's reentrant lock (:class:`~hpu_runtime.bridge.sim_device.SimDevice`); and the class
    ``PendingOps``, the pending graph's records (NOTE [records made when read] in
    :mod:`hpu_runtime.bridge.launcher`). Installs the library first.

    Raises:
        DeviceTypeBuildError: as :func:`install`.
    """
    global _builtins
    if _builtins is None:
        _builtins = library().hpu_sim_builtins()
    return _builtins


def _noncontiguous_supported(device) -> bool:
    return True


def _fake_strides_as_the_kernels_make_them() -> None:
    """NOTE [fake hpu tensors keep the CPU kernels' strides]
    PyTorch's fake tensors (``FakeTensorMode``: the tracer, ``torch.compile``) make every
    elementwise result on an ``hpu`` device contiguous (``is_noncontiguous_supported`` in
    ``torch/_subclasses/fake_impls.py`` and ``torch/_refs``), as Intel's bridge does. The
    simulated card runs the CPU kernels, which keep their input's layout (``q * scale`` of a
    transposed ``q`` stays transposed), so a fake step would take other paths than the live
    one (a ``reshape`` that is a view on one side and a copy on the other: GPT-2's attention
    made 4 copies per step live that its trace lacked, and live != planned). Fake hpu tensors
    here follow the kernels that really run: every device supports non-contiguous results."""
    import torch._refs as refs
    import torch._subclasses.fake_impls as fake_impls

    fake_impls.is_noncontiguous_supported = _noncontiguous_supported
    refs.is_noncontiguous_supported = _noncontiguous_supported


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over ``t``'s storage (no copy; writes through it change ``t``); ``t`` itself
    if it is not an ``hpu`` tensor."""
    return _cpu_view(t) if t.device.type == "hpu" else t
