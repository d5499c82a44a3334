"""``torch.autocast("hpu", dtype=torch.bfloat16)`` on the simulated Gaudi.

NOTE [autocast on hpu tensors]
Autocast is a per-backend dispatch key: a ``torch.autocast("hpu")`` region enables the
``AutocastHPU`` key, which hpu tensors carry. Its kernels come with the ``hpu`` device type
(``csrc/hpu_autocast.cpp``, built by :mod:`hpu_runtime.bridge.device_type`): the op lists torch
keeps for out-of-tree backends in ``ATen/autocast_mode.h`` with torch's own casting wrapper
(matmuls, convolutions and linear layers in the region's lower precision; reductions, norms,
softmax and losses in fp32; ``cat``, ``stack``, ``addcmul``... at their widest input), so
matmuls really run in bf16 on the CPU kernels (real numerics) and the cost model charges them
at the bf16 MME rate because it sees bf16 inputs. :func:`install` keeps a region's dtype bf16
by default, as on Gaudi, and turns an fp32 "region" (Lightning's precision "32") into none.
CPU tensors are not autocast by an ``"hpu"`` region, as on Gaudi. Also reachable as
``torch.hpu.amp.autocast``.

NOTE [fp32 on the host, bf16 on the device]
A CPU without fast bf16 matmul runs a bf16 autocast region many times slower than fp32 (a
BERT-Large layer: 14x here). With ``PT_HPU_AUTOCAST_FP32_ON_HOST=1`` an ``"hpu"`` autocast
region computes in fp32 on the host (autocast itself stays off) while the simulated device is
charged as if it ran in bf16: every fp32 op in the region, and in the backward that follows
it up to the next ``mark_step``, is charged at the bf16 rates with 2 bytes per element,
except the ops autocast keeps in fp32 (softmax, losses, norms, reductions:
``hpu_runtime.bridge.op_accounting.FP32_AUTOCAST_OPS``). The numerics trade-off: results are fp32 results,
more accurate than the bf16 run they stand for (no bf16 rounding, no overflow behaviour of
bf16), so losses and gradients differ from a faithful bf16 run in the low bits. The casts
a faithful region makes of each fp32 weight a matmul uses (to bf16 in forward, its gradient
back to fp32 in backward) are charged once per region at the weight's first use; the casts
of activations are not (an fp32 activation is charged as bf16 without its cast).
Use it for timing studies and long runs of big models; keep it off to test bf16 numerics.

NOTE [Gaudi's autocast op lists]
``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` name files
with one op per line (optimum-habana's ``GaudiConfig`` writes them from ``autocast_bf16_ops``
/ ``autocast_fp32_ops``); on Gaudi they replace autocast's default lists. They are read at
the first ``"hpu"`` autocast region of the process (Gaudi reads them when the bridge loads)
and applied by kernels registered for the ``AutocastHPU`` key: a listed op casts its floating
hpu inputs to the region's dtype (lower list) or to fp32 (fp32 list); an op the default lists
would cast but neither list names runs in its inputs' dtypes (the promote ops ``cat``, ``stack``, ``index_copy`` keep theirs).
Python operator names Gaudi's lists use (``iadd``, ``truediv``, ``rsub``...) map to their
aten ops; in-place overloads are not cast. Process-wide, for the life of the process,
except inside :func:`op_lists` (a tracer planning a published run with its script's lists).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch.amp import autocast_mode

import logging
import warnings

from torch.utils._pytree import tree_map

from .config import RuntimeConfig
from .runtime import config, get_device

log = logging.getLogger(__name__)

LOWER_LIST_VAR = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_LIST_VAR = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
_PROMOTE = frozenset({"cat", "stack", "index_copy"})
_PYTHON_NAMES = {"iadd": "add_", "isub": "sub_", "imul": "mul_", "itruediv": "div_", "truediv": "div",
                 "floordiv": "floor_divide", "radd": "add", "rmul": "mul"}
_op_lists_read = False
_library = None  # keeps the registrations alive


def _read_list(var: str, path: str | None) -> list[str] | None:
    if not path:
        return None
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise ValueError(f"{var}={path!r}: cannot read the op list ({exc})") from None


def _overloads(name: str) -> list[str] | None:
    """The non-mutating overloads of aten op ``name`` (qualified names), or None if no such op."""
    try:
        packet = getattr(torch.ops.aten, _PYTHON_NAMES.get(name, name))
    except AttributeError:
        return None
    out = []
    for ov in packet.overloads():
        op = getattr(packet, ov)
        if not op._schema.is_mutable:
            out.append(op._schema.name.split("::")[1] + ("" if ov == "default" else f".{ov}"))
    return out


def _casting_kernel(op, to_lower: bool):
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastHPU)

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("hpu") if to_lower else torch.float32

        def cast(x):
            if (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
                    and x.device.type == "hpu"):
                return x.to(dtype)
            return x

        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def _register_lists(lower: frozenset[str], fp32: frozenset[str]):
    """A library whose ``AutocastHPU`` kernels apply ``lower`` / ``fp32`` (NOTE [Gaudi's
    autocast op lists]); it stays in force while referenced, and until ``_destroy()``."""
    named = {_PYTHON_NAMES.get(n, n) for n in lower | fp32}
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
        for full in torch._C._dispatch_get_all_op_names():
            if not full.startswith("aten::") or not torch._C._dispatch_has_kernel_for_dispatch_key(full, "AutocastHPU"):
                continue
            base = full[len("aten::"):].split(".")[0]
            if base not in named and base not in _PROMOTE:
                lib.impl(full[len("aten::"):], torch.library.fallthrough_kernel, "AutocastHPU")
        for names, to_lower in ((lower, True), (fp32, False)):
            for name in sorted(names):
                overloads = _overloads(name)
                if overloads is None:
                    log.warning("hpu autocast: %r in the op lists is not an aten op; ignored", name)
                for qual in overloads or ():
                    base, _, ov = qual.partition(".")
                    op = getattr(getattr(torch.ops.aten, base), ov or "default")
                    lib.impl(qual, _casting_kernel(op, to_lower), "AutocastHPU")
    return lib


_applied: tuple[frozenset, frozenset] | None = None  # the lists _library applies


def apply_op_lists() -> bool:
    """Apply Gaudi's autocast op lists once per process (NOTE [Gaudi's autocast op lists]).

    Returns:
        whether lists were given and applied (False on every call after the first).

    Raises:
        ValueError: a list variable names a file that cannot be read.
    """
    global _op_lists_read, _library, _applied
    if _op_lists_read:
        return False
    _op_lists_read = True
    cfg = RuntimeConfig.from_env()  # now, not at device creation: GaudiConfig sets them late
    lower = _read_list(LOWER_LIST_VAR, cfg.autocast_lower_precision_ops_list)
    fp32 = _read_list(FP32_LIST_VAR, cfg.autocast_fp32_ops_list)
    if lower is None and fp32 is None:
        return False
    _applied = (frozenset(lower or ()), frozenset(fp32 or ()))
    _library = _register_lists(*_applied)
    return True


@contextmanager
def op_lists(lower: Iterable[str], fp32: Iterable[str]) -> Iterator[None]:
    """Within the block, ``"hpu"`` autocast regions use these op lists instead of the process's
    (the files ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` / ``PT_HPU_AUTOCAST_FP32_OPS_LIST``
    would name, or torch's defaults); the process's lists are back after it. For tracers that
    plan several published runs in one process, each with the lists its script passed
    (Habana's BERT scripts: ``ops_bf16_bert_pt.txt`` / ``ops_fp32_bert_pt.txt``). Not
    thread-safe: the lists are process-wide while the block runs."""
    global _library, _applied
    apply_op_lists()  # the environment's lists are read first, so they cannot replace these later
    previous = _applied
    if _library is not None:
        _library._destroy()
    _library, _applied = None, (frozenset(lower), frozenset(fp32))
    try:
        _library = _register_lists(*_applied)
        yield
    finally:  # also when registering failed part-way: the process's lists come back either way
        if _library is not None:
            _library._destroy()
        _applied = previous
        _library = _register_lists(*previous) if previous is not None else None


__all__ = ["apply_op_lists", "autocast", "hpu_region", "install", "op_lists"]

_installed = False
_regions = threading.local()


def hpu_region() -> torch.dtype | None:
    """The dtype of the calling thread's innermost enabled ``torch.autocast("hpu")`` region, or
    None outside one (``torch.hpu.is_autocast_hpu_enabled`` / ``get_autocast_hpu_dtype``)."""
    stack = getattr(_regions, "stack", None)
    return stack[-1] if stack else None


def install() -> None:
    """Make ``torch.autocast("hpu", ...)`` a Gaudi region (idempotent; NOTE [autocast on hpu tensors])."""
    global _installed
    if _installed:
        return
    cls = autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self._hpu_emulated = False
        self._hpu_region = None
        if isinstance(device_type, str) and device_type.startswith("hpu"):
            apply_op_lists()
            device_type = "hpu"
            if dtype is None:
                dtype = torch.bfloat16
            if dtype == torch.float32:  # an fp32 "autocast" region (Lightning's precision "32")
                enabled = False         # is plain fp32, as on Gaudi
            if enabled:
                self._hpu_region = dtype
            if enabled and dtype in (torch.bfloat16, torch.float16) and config().autocast_fp32_on_host:
                self._hpu_emulated, enabled = True, False
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    enter, exit_ = cls.__enter__, cls.__exit__

    def __enter__(self):
        region = getattr(self, "_hpu_region", None)
        if region is not None:
            if not hasattr(_regions, "stack"):
                _regions.stack = []
            _regions.stack.append(region)
        if getattr(self, "_hpu_emulated", False):
            get_device().set_fp32_as_bf16(True)
        return enter(self)

    def __exit__(self, *exc):
        if getattr(self, "_hpu_region", None) is not None:
            _regions.stack.pop()
        if getattr(self, "_hpu_emulated", False):
            get_device().set_fp32_as_bf16(False)
        return exit_(self, *exc)

    for new, old in ((__init__, original), (__enter__, enter), (__exit__, exit_)):
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
    cls.__init__, cls.__enter__, cls.__exit__ = __init__, __enter__, __exit__
    _installed = True


class autocast(autocast_mode.autocast):  # noqa: N801 - torch.hpu.amp.autocast
    """``torch.hpu.amp.autocast(dtype=torch.bfloat16)``: autocast for the simulated Gaudi."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16,
                 cache_enabled: bool = True) -> None:
        install()
        super().__init__("hpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
