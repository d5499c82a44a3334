"""Intel Gaudi's GPU Migration Toolkit on the simulated Gaudi: a script written for NVIDIA GPUs
(``device="cuda"``, ``.cuda()``, ``torch.cuda.*``, ``backend="nccl"``) runs unmodified on the
simulated card over "hccl".

Enabled as on Gaudi (Intel's "GPU Migration Toolkit" page; HabanaAI/Model-References
``PyTorch/examples/gpu_migration/README.md``: since 1.17 one environment variable does it):
``PT_HPU_GPU_MIGRATION=1`` in the environment (read when ``habana_frameworks.torch`` is
imported, and at ``import torch`` through the package's ``torch.backends`` entry point, so a
script that never names Gaudi works too), or ``import habana_frameworks.torch.gpu_migration``
at the top of the script. Once enabled it stays on for the process.

What is mapped (Intel's page lists ``torch.cuda``, torch calls with GPU arguments, Apex and
pynvml; its sample logs in HabanaAI/Model-References ``PyTorch/examples/gpu_migration/``, for
example ``simple_examples/mnist/gpu_migration_logs/gpu_migration_66.log``, show the calls below
and what each became):

==========================================  ================================================
GPU call                                    on the simulated Gaudi
==========================================  ================================================
a ``cuda`` device argument (``"cuda"``,     ``"hpu"`` (one card per process, as on Gaudi:
``"cuda:N"``, ``torch.device("cuda", N)``)  every index is the process's card)
to the factories (``torch.zeros``,
``randn``, ``tensor``, ``arange``, the
``*_like`` and ``Tensor.new_*`` ones...),
``Tensor.to``
``Tensor.cuda()``, ``Module.cuda()``        ``.to("hpu")`` (``Module.cuda`` reaches
                                            ``Tensor.cuda`` for each parameter)
``torch.cuda.<name>`` for every name        ``torch.hpu.<name>`` (``is_available``,
``torch.hpu`` has                           ``device_count``, ``set_device``,
                                            ``synchronize``, ``manual_seed_all``, the
                                            memory statistics, ``Stream``, ``Event``...)
``torch.autocast("cuda", dtype=...)``,      ``torch.autocast("hpu", dtype=...)``; float16 becomes
``torch.cuda.amp.autocast()``               bfloat16 under ``PT_HPU_CONVERT_FP16_TO_BF16_FOR_
                                            MIGRATION=1``, Intel's flag (default off)
``torch.amp.GradScaler("cuda")``,           ``GradScaler("hpu", enabled=False)``, as Intel's
``torch.cuda.amp.GradScaler()``             builds it (Gaudi's mixed precision is bf16)
``torch.cuda.FloatTensor(data)`` and the    ``torch.FloatTensor(data).to("hpu")``
other legacy constructors
``torch.cuda.nvtx.range`` and friends       do nothing
``init_process_group("nccl")``,             ``"hccl"``; ``get_backend()`` answers
``new_group(backend="nccl")``               ``"nccl"`` for an hccl group, as Intel's does, so
                                            GPU code that checks it goes on;
                                            ``is_nccl_available()`` is True
``DistributedDataParallel(device_ids=       ``device_ids`` and ``output_device`` None, as
[local_rank], output_device=local_rank)``   Intel's (the module is on the process's card)
``torch.compile`` with the default          ``backend="hpu_backend"`` (inductor has no
``"inductor"`` backend                      Gaudi code generator); inductor's ``mode`` and
                                            ``options`` are dropped
==========================================  ================================================

A ``torch.cuda`` name that ``torch.hpu`` lacks is left as it is (it fails as it would on a
machine without CUDA); ``torch.device("cuda")`` objects stay CUDA devices, as on Gaudi, and
are mapped where they are used.

Logging: with ``GPU_MIGRATION_LOG_LEVEL`` set (not ``0``), each distinct conversion, with the
call site and its source line, is written once to
``$HABANA_LOGS/gpu_migration_logs/gpu_migration_<pid>.log`` (``HABANA_LOGS`` defaulting to
``~/.habana_logs``), in the ``[context]`` / ``[hpu_match]`` form of Intel's sample logs; the
levels' finer meaning is not modelled.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..bridge.config import RuntimeConfig

__all__ = ["enable", "is_enabled", "requested", "to_hpu_device"]

ENV = "PT_HPU_GPU_MIGRATION"

_FACTORIES = ("tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
              "randperm", "arange", "range", "linspace", "logspace", "eye", "zeros_like", "ones_like",
              "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "empty_strided",
              "scalar_tensor", "tril_indices", "triu_indices", "normal", "bernoulli", "multinomial")
_TENSOR_METHODS = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided")
_CUDA_NAMES = ("is_available", "device_count", "current_device", "set_device", "synchronize", "get_device_name",
               "get_device_properties", "is_initialized", "init", "is_bf16_supported", "initial_seed", "get_rng_state",
               "set_rng_state", "get_rng_state_all", "set_rng_state_all", "memory_allocated", "max_memory_allocated",
               "memory_reserved", "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_stats",
               "memory_summary", "memory_usage", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
               "mem_get_info", "empty_cache", "Stream", "Event", "stream", "current_stream", "default_stream",
               "set_stream", "device", "device_of", "graph", "make_graphed_callables")

_lock = threading.Lock()
_enabled = False
_fp16_to_bf16 = False
_log_file: Any = None
_logged: set[tuple[str, int, str]] = set()


def requested() -> bool:
    """Whether the environment asks for the toolkit (``PT_HPU_GPU_MIGRATION`` = 1 / true).

    Raises:
        ValueError: a malformed ``hpu_runtime`` variable, naming it (``RuntimeConfig``).
    """
    return RuntimeConfig.from_env().gpu_migration


def is_enabled() -> bool:
    """Whether the GPU calls are being mapped in this process."""
    return _enabled


def _is_cuda(device: object) -> bool:
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, torch.device) and device.type == "cuda"


def to_hpu_device(device: object) -> object:
    """``device`` with a CUDA device (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda", N)``)
    replaced by ``"hpu"``; anything else unchanged."""
    return "hpu" if _is_cuda(device) else device


def _log(kind: str, what: str) -> None:
    """One line per distinct conversion and call site (only while logging is on)."""
    if _log_file is None:
        return
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    where = (frame.f_code.co_filename, frame.f_lineno, what) if frame is not None else ("?", 0, what)
    with _lock:
        if where in _logged:
            return
        _logged.add(where)
        context = linecache.getline(where[0], where[1]).rstrip()
        _log_file.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {where[0]}:{where[1]}\n"
                        f"    [context]: {context}\n    [{kind}]: {what}\n\n")
        _log_file.flush()


def _device_kwarg_to_hpu(kwargs: dict, name: str) -> None:
    """``kwargs["device"]`` set to ``"hpu"`` where it names a CUDA device (logged as a call of
    ``name``)."""
    device = kwargs.get("device")
    if device is not None and _is_cuda(device):
        kwargs["device"] = "hpu"
        _log("hpu_match", f"{name}(device={device}) --> {name}(device=hpu)")


def _map_device_kwarg(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _device_kwarg_to_hpu(kwargs, name)
        return fn(*args, **kwargs)

    wrapper.__gpu_migration_wrapped__ = fn
    return wrapper


def _wrap_tensor_to(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def to(self, *args, **kwargs):
        if args and _is_cuda(args[0]):
            _log("hpu_match", f"torch.Tensor.to({args[0]}) --> torch.Tensor.to(hpu)")
            args = ("hpu", *args[1:])
        _device_kwarg_to_hpu(kwargs, "torch.Tensor.to")
        return fn(self, *args, **kwargs)

    to.__gpu_migration_wrapped__ = fn
    return to


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.cuda()`` on the simulated Gaudi: ``Tensor.to("hpu")``."""
    _log("hpu_match", "torch.Tensor.cuda() --> torch.Tensor.to(hpu)")
    return self.to("hpu", non_blocking=non_blocking, memory_format=memory_format)


def _seed_card(seed: int) -> None:
    """``torch.cuda.manual_seed(_all)``: the card's generator is the host's default generator
    (its tensors live on the host), seeded directly: ``torch.manual_seed`` calls
    ``torch.cuda.manual_seed_all`` itself, and ``torch.hpu.manual_seed_all`` calls it back."""
    _log("hpu_match", f"torch.cuda.manual_seed_all({seed}) --> torch.hpu.random.manual_seed_all({seed})")
    torch.default_generator.manual_seed(int(seed))


def _reseed_card() -> None:
    """``torch.cuda.seed(_all)``: a non-deterministic seed for the card's (the host's) generator."""
    torch.default_generator.seed()


def _map_cuda_function(name: str, target: Callable) -> Callable:
    if isinstance(target, type):
        return target  # classes (Stream, Event, device) are handed over as they are

    @functools.wraps(target)
    def wrapper(*args, **kwargs):
        _log("hpu_match", f"torch.cuda.{name}() --> torch.hpu.{name}()")
        return target(*(to_hpu_device(a) for a in args), **{k: to_hpu_device(v) for k, v in kwargs.items()})

    return wrapper


class _Autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast`` with a ``"cuda"`` device type taken as ``"hpu"``; its dtype kept, except
    float16 under ``PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION=1``, which becomes bfloat16 (the
    flag of Intel's toolkit, default off: Model-References' torchvision GPU-migration README)."""

    def __init__(self, device_type: str = "cuda", dtype: torch.dtype | None = None, *args, **kwargs) -> None:
        if device_type == "cuda":
            device_type = "hpu"
            dtype = torch.float16 if dtype is None else dtype  # CUDA autocast's default
            if dtype == torch.float16 and _fp16_to_bf16:
                dtype = torch.bfloat16
            _log("hpu_match", f"torch.autocast(device_type=cuda) --> torch.autocast(device_type=hpu, dtype={dtype})")
        super().__init__(device_type, dtype, *args, **kwargs)


def _cuda_amp_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
    """``torch.cuda.amp.autocast(...)`` (float16 unless told): ``torch.autocast("cuda", ...)``,
    which runs on ``"hpu"``."""
    return _Autocast("cuda", dtype, enabled=enabled, cache_enabled=cache_enabled)


class _GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` on ``"cuda"``: built disabled on ``"hpu"``, as Intel's toolkit
    does (``torch.cuda.amp.GradScaler.__init__(...) --> set enabled to False`` in its sample log,
    torchvision ``gpu_migration_958.log``; Gaudi's mixed precision is bf16, which needs no loss
    scaling): ``scale()`` returns the loss as it is and ``step()`` is the optimizer's step."""

    def __init__(self, device: str = "cuda", *args, **kwargs) -> None:
        if device == "cuda":
            _log("hpu_match", "torch.amp.GradScaler(cuda) --> torch.amp.GradScaler(hpu, enabled=False)")
            device = "hpu"
            kwargs["enabled"] = False
            if len(args) >= 5:  # (init_scale, growth_factor, backoff_factor, growth_interval, enabled, ...)
                args = (*args[:4], False, *args[5:])
                kwargs.pop("enabled")
        super().__init__(device, *args, **kwargs)


def _cuda_grad_scaler(*args, **kwargs) -> torch.amp.GradScaler:
    """``torch.cuda.amp.GradScaler(...)``: as ``torch.amp.GradScaler("cuda", ...)``."""
    return _GradScaler("cuda", *args, **kwargs)


_LEGACY_TENSORS = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                   "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")


def _legacy_tensor(name: str) -> Callable:
    """``torch.cuda.FloatTensor(data)`` and its kind: ``torch.FloatTensor(data).to("hpu")``, as
    Intel's toolkit builds them (Megatron-DeepSpeed ``gpu_migration_424488.log``)."""
    host = getattr(torch, name)

    def legacy(*args, **kwargs):
        _log("hpu_modified", f"torch.cuda.{name}() --> torch.{name}().to(hpu)")
        return host(*args, **kwargs).to("hpu")

    legacy.__name__ = legacy.__qualname__ = name
    return legacy


class _NoRange:
    """``torch.cuda.nvtx.range(...)``: nothing to mark on Gaudi (Intel's toolkit: a dummy)."""

    def __init__(self, *args, **kwargs) -> None:
        _log("hpu_mismatch", "torch.cuda.nvtx.range() --> Dummy")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Callable) -> Callable:
        return fn


def _no_nvtx(*args, **kwargs) -> int:
    """``torch.cuda.nvtx.range_push`` / ``range_pop`` / ``mark`` / ``range_start`` /
    ``range_end``: nothing (0, the depth or id NVTX would return)."""
    return 0


def _map_backend(backend: object) -> object:
    """``"nccl"`` (alone or as a ``"cuda:nccl,cpu:gloo"`` part) as ``"hccl"``."""
    if isinstance(backend, str) and "nccl" in backend.lower():
        mapped = ",".join(("hpu:hccl" if p.strip().lower() == "cuda:nccl" else
                           "hccl" if p.strip().lower() == "nccl" else p) for p in backend.split(","))
        _log("hpu_match", f"backend={backend} --> backend={mapped}")
        return mapped
    return backend


def _wrap_backend_arg(fn: Callable, position: int) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _map_backend(kwargs["backend"])
        elif len(args) > position:
            args = (*args[:position], _map_backend(args[position]), *args[position + 1:])
        return fn(*args, **kwargs)

    wrapper.__gpu_migration_wrapped__ = fn
    return wrapper


def _wrap_get_backend(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def get_backend(*args, **kwargs):
        name = fn(*args, **kwargs)
        if name == "hccl":
            _log("hpu_match", "torch.distributed.get_backend() hccl --> nccl")
            return "nccl"
        return name

    get_backend.__gpu_migration_wrapped__ = fn
    return get_backend


def _wrap_compile(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def compile(*args, **kwargs):
        if kwargs.get("backend", "inductor") == "inductor":
            _log("hpu_modified", "torch.compile(backend=inductor) --> torch.compile(backend=hpu_backend)")
            kwargs["backend"] = "hpu_backend"
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        return fn(*args, **kwargs)

    compile.__gpu_migration_wrapped__ = fn
    return compile


def _wrap_ddp_init(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            _log("hpu_match", f"DistributedDataParallel(device_ids={device_ids}, output_device={output_device}) --> "
                              "change device_ids and output_device to None")
        return fn(self, module, None, None, *args, **kwargs)

    __init__.__gpu_migration_wrapped__ = fn
    return __init__


def _open_log(where: str | None) -> None:
    global _log_file
    if where is None:
        return
    root = Path(where)
    root.mkdir(parents=True, exist_ok=True)
    _log_file = open(root / f"gpu_migration_{os.getpid()}.log", "a", encoding="utf-8")  # noqa: SIM115 - process-long


def enable() -> None:
    """Map the GPU calls of this process onto the simulated Gaudi (idempotent).

    Raises:
        RuntimeError: a real CUDA device is present (the toolkit would hide it).
    """
    global _enabled, _fp16_to_bf16
    with _lock:
        if _enabled:
            return
        if torch.cuda.is_available():
            raise RuntimeError(f"{ENV}=1: this machine has CUDA devices; the GPU Migration Toolkit maps CUDA "
                               "calls to the simulated Gaudi and would hide them")
        import hpu_runtime  # noqa: F401 - the bridge, "hpu" and torch.hpu
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        config = RuntimeConfig.from_env()
        _open_log(config.gpu_migration_log_dir)
        _fp16_to_bf16 = config.gpu_migration_fp16_to_bf16
        for name in _FACTORIES:
            fn = getattr(torch, name, None)
            if fn is not None:
                setattr(torch, name, _map_device_kwarg(fn, f"torch.{name}"))
        for name in _TENSOR_METHODS:
            setattr(torch.Tensor, name, _map_device_kwarg(getattr(torch.Tensor, name), f"torch.Tensor.{name}"))
        torch.Tensor.to = _wrap_tensor_to(torch.Tensor.to)
        torch.Tensor.cuda = _tensor_cuda
        for name in _CUDA_NAMES:
            target = getattr(torch.hpu, name, None)
            if target is not None:
                setattr(torch.cuda, name, _map_cuda_function(name, target))
        for alias in ("reset_max_memory_allocated", "reset_max_memory_cached"):  # torch's deprecated names
            setattr(torch.cuda, alias, _map_cuda_function(alias, torch.hpu.reset_peak_memory_stats))
        torch.cuda.manual_seed = torch.cuda.manual_seed_all = _seed_card
        torch.cuda.seed = torch.cuda.seed_all = _reseed_card
        torch.autocast = torch.amp.autocast = _Autocast
        torch.amp.GradScaler = _GradScaler
        torch.cuda.amp.autocast = _cuda_amp_autocast
        torch.cuda.amp.GradScaler = _cuda_grad_scaler
        for name in _LEGACY_TENSORS:
            setattr(torch.cuda, name, _legacy_tensor(name))
        torch.cuda.nvtx.range = _NoRange
        for name in ("range_push", "range_pop", "range_start", "range_end", "mark"):
            setattr(torch.cuda.nvtx, name, _no_nvtx)
        # torch.distributed's names only: c10d's own calls keep seeing "hccl" (its NCCL-only
        # paths, a barrier on a CUDA device for one, must not be taken)
        dist.init_process_group = _wrap_backend_arg(c10d.init_process_group, 0)
        dist.new_group = _wrap_backend_arg(c10d.new_group, 2)
        dist.get_backend = _wrap_get_backend(c10d.get_backend)
        dist.is_nccl_available = lambda: True
        torch.compile = _wrap_compile(torch.compile)
        ddp = torch.nn.parallel.DistributedDataParallel
        ddp.__init__ = _wrap_ddp_init(ddp.__init__)
        _enabled = True
