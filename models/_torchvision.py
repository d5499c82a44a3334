"""Import torchvision's pure-Python model definitions when its compiled ops cannot load.

NOTE [torchvision on the CPU torch wheel]
    The registry's torchvision 0.28.0 wheels (the release paired with torch 2.13.0) are built
    against the CUDA torch build: with the CPU torch wheel ``torchvision/_C.so`` cannot load
    (it links ``libtorch_cuda.so``). torchvision tolerates that almost everywhere
    (``extension._has_ops()`` turns False and every meta registration is skipped) except in
    ``torchvision/_meta_registrations.py``, which calls
    ``torch.library.register_fake("torchvision::nms")`` and ``("torchvision::qnms")``
    unguarded; registering a fake kernel for an operator with no schema raises
    ``RuntimeError: operator torchvision::nms does not exist`` and ``import torchvision``
    fails. The model definitions (``torchvision.models``) are pure Python and need none of
    the compiled ops.

What :func:`import_torchvision` does:
    1. ``import torchvision``; if that works (a matching CPU torchvision whose ``_C`` loads,
       or an earlier call of this function), return it and change nothing.
    2. Otherwise drop the half-imported ``torchvision`` / ``torchvision.*`` entries from
       ``sys.modules`` (so the retry re-executes every module), define the two missing
       schemas with ``torch.library`` -- exactly as torchvision's C++ declares them,
       ``torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor`` and
       ``torchvision::qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor`` --
       each only if it does not exist yet, give them CPU kernels in pure torch, and import
       again. torchvision's own ``register_fake`` then attaches its meta kernels to them,
       so ``nms`` also works under ``FakeTensorMode``.
    3. ``torchvision.ops.nms`` first calls ``extension._assert_has_ops()``, which raises
       while ``_C`` is missing; the shim rebinds ``torchvision.ops.nms`` and
       ``torchvision.ops.boxes.nms`` (which ``batched_nms`` looks up) to the same function
       without that check. Nothing else in torchvision is touched.

What it does not do:
    Every other compiled op (``roi_align``, ``roi_pool``, ``ps_roi_*``, ``deform_conv2d``,
    ``box_iou_rotated``, image/video decoding) stays missing and raises torchvision's own
    "Couldn't load custom C++ ops" error. The CPU ``nms`` kernel is a plain greedy loop
    (O(N^2) IoU matrix), correct but not fast. It never installs or switches torch builds.
    The ``qnms`` kernel receives ``int_repr()`` values (as ``torchvision.ops.nms`` passes
    them) and runs the same greedy NMS on them as floats: for per-tensor quantisation the
    shared scale and zero point cancel out of every IoU and preserve the score order.

The function is idempotent: the ``torch.library.Library`` handle lives at module level and
each schema is defined at most once per process.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

import torch

__all__ = ["import_torchvision", "nms_reference", "define_missing_schemas", "after_import"]

_LIB: torch.library.Library | None = None
_LOCK = threading.Lock()
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def nms_reference(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression in pure torch (torchvision's CPU kernel semantics).

    Args:
        dets: ``(N, 4)`` boxes ``(x1, y1, x2, y2)``.
        scores: ``(N,)`` scores.
        iou_threshold: a box is dropped when its IoU with a kept, higher-scoring box is
            strictly greater than this.

    Returns:
        int64 ``(K,)`` indices of the kept boxes in decreasing score order.
    """
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    dets = dets.float()
    order = torch.argsort(scores.float(), descending=True, stable=True)
    b = dets[order]
    x1, y1, x2, y2 = b.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    w = (torch.minimum(x2[:, None], x2[None, :]) - torch.maximum(x1[:, None], x1[None, :])).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2[None, :]) - torch.maximum(y1[:, None], y1[None, :])).clamp(min=0)
    inter = w * h
    iou = inter / (areas[:, None] + areas[None, :] - inter)
    over = (iou > iou_threshold).tolist()
    n = len(over)
    suppressed = [False] * n
    keep: list[int] = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        row = over[i]
        for j in range(i + 1, n):
            if row[j]:
                suppressed[j] = True
    return order[torch.tensor(keep, dtype=torch.long, device=dets.device)]


def _op_exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def define_missing_schemas() -> None:
    """Define ``torchvision::nms``/``qnms`` with CPU kernels, each only if it does not exist.

    Called by :func:`import_torchvision` on a failed import and, through the start-up import
    hook (:mod:`hpu_runtime.import_hooks`), just before ``torchvision._meta_registrations``
    runs, i.e. after torchvision tried to load its own ops: with a working torchvision both
    schemas exist and nothing is defined.
    """
    global _LIB
    missing = [name for name in _SCHEMAS if not _op_exists(name)]
    if not missing:
        return
    if _LIB is None:
        _LIB = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901 kept alive here
    for name in missing:
        _LIB.define(_SCHEMAS[name])
        _LIB.impl(name, nms_reference, "CPU")


def _nms_without_ops_check(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """``torchvision.ops.nms`` minus ``_assert_has_ops()`` (the ops it calls exist now)."""
    if boxes.is_quantized:
        return torch.ops.torchvision.qnms(boxes.int_repr(), scores.int_repr(), iou_threshold)
    return torch.ops.torchvision.nms(boxes, scores, iou_threshold)


def after_import(tv: ModuleType) -> None:
    """Make ``torchvision.ops.nms`` usable when torchvision's compiled ops did not load."""
    if not tv.extension._has_ops():
        tv.ops.nms = _nms_without_ops_check
        tv.ops.boxes.nms = _nms_without_ops_check


def _forget_partial_import() -> None:
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]


def import_torchvision() -> ModuleType:
    """Return the ``torchvision`` module, defining its two unguarded op schemas if needed.

    Raises:
        ImportError: torchvision is not installed, or its import still fails after the two
            schemas exist (then the cause is something else and is chained).
    """
    with _LOCK:
        tv = sys.modules.get("torchvision")
        if tv is not None and hasattr(tv, "models"):
            return tv
        try:
            return importlib.import_module("torchvision")
        except ModuleNotFoundError:
            raise
        except Exception as first:  # noqa: BLE001 - any failure of the compiled-op path
            _forget_partial_import()
            if all(_op_exists(name) for name in _SCHEMAS):
                raise ImportError(f"import torchvision failed for another reason: {first}") from first
            define_missing_schemas()
            try:
                tv = importlib.import_module("torchvision")
            except Exception as second:
                _forget_partial_import()
                raise ImportError(f"import torchvision failed even with nms/qnms defined: {second}") from second
        after_import(tv)
        return tv
