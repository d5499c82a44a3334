"""Wall-clock cost of the ways tried to make simulated-Gaudi tensors report ``device(type='hpu')``.

The landed design is a device type that keeps CPU storage, in C++ (NOTE [a device type for
the simulated Gaudi] in :mod:`hpu_runtime.bridge.device_type`); this benchmark keeps the
measurements that chose it. It measures, side by side in one process and in alternating
rounds, the per-op wall time of a small ``add`` and a 64x64 ``mm`` (and one ``.device`` read) for:

==========================  ===========================================================================
variant                     what runs
==========================  ===========================================================================
``plain``                   plain CPU tensors, bridge off
``hpu``                     hpu tensors (the landed C++ device type), bridge off: the C++ hop alone
``bridge``                  hpu tensors under the bridge (the kernel's hooks, charged to the card)
``wrapper``                 a wrapper tensor subclass (``_make_wrapper_subclass(device="hpu")`` over a
                            CPU tensor; ``__torch_dispatch__`` unwraps, runs, rewraps), bridge off
``wrapper+bridge``          the wrapper under the bridge (the cost a wrapper design would add)
``device property``         a Python ``Tensor.device`` that answers ``hpu`` for tensors on the
                            simulated card (one dict lookup), read once per op
==========================  ===========================================================================

What was tried (torch 2.13 CPU wheel) before the C++ device type:

* Any tensor whose C++ device is ``hpu`` (a wrapper subclass, or a DTensor built over a
  tensor that *says* hpu) makes autograd look up the ``hpu`` DeviceGuardImpl in backward,
  which the CPU wheel lacks: the process aborts ("PyTorch is not linked with support for hpu
  devices"; the wrapper prototype here does so in its first backward). So every design
  needs a guard registered from C++ (``C10_REGISTER_GUARD_IMPL(HPU, ...)``): a small compiled
  extension (``--extension`` times compiling one with ``torch.utils.cpp_extension``: 64 s
  here). With that guard loaded, the prototype's backward gets further and stops at "Cannot
  access accelerator device when none is available": autograd asks the accelerator hooks,
  which for ``hpu`` are ``at::HPUHooksInterface``, also to be registered from C++. With a
  guard, autograd also gives ``hpu`` its own device thread, where the bridge's thread-local
  modes are not active: ``torch.autograd.set_multithreading_enabled(False)`` keeps backward on
  the training thread.
* A Python ``Tensor.device`` property (no C++ change) costs nothing per op but one lookup per
  read; it cannot stay consistent: DTensor (FSDP2's parameters) builds its wrapper with the
  device its local tensor reports, which brings the guard problem back, while C++ code
  (DDP's reducer, collectives) sees CPU.
* The bridge marks every output of a device op resident, including host-side results
  (``torch.randn(4)`` without a device); "on hpu" needs its own flag propagated per op (from
  ``device="hpu"``, ``.to("hpu")`` and hpu inputs), and ``.to("hpu")`` / ``.cpu()`` must copy
  (today they return the same storage).

Measured here (2-core machine shared with other sessions, ``--rounds 3 --ops 1000``; ratios
side by side): plain add 17.5 µs, bridge 80 µs (4.6x), wrapper alone 120 µs (6.9x), wrapper
under the bridge 249 µs (14x; mm 13x); a ``.device`` read 0.09 µs plain, 0.15 µs through a
Python property, and 17 µs under the bridge of that time (its ``TorchFunctionMode`` saw every
``Tensor.device`` access; the bridge has had no function mode since, NOTE [the bridge over hpu
tensors] in :mod:`hpu_runtime.bridge.dispatch`). A Python wrapper adds about twice the bridge's whole per-op cost,
far from the bridge's 2x-of-PyTorch target, so it is rejected.

Chosen: a device type that keeps CPU storage, in C++ (``hpu_runtime/bridge/csrc``): the
``hpu`` DeviceGuardImpl, accelerator hooks and allocator (the CPU allocator), and one boxed
kernel for the ``HPU`` dispatch key that views the operands as CPU tensors (same data
pointer, no copy) and redispatches to the CPU kernels, re-viewing outputs as ``hpu``: a C++
hop per op, the bridge's dispatch mode staying the only Python one (since November 2026 the
kernel calls the bridge itself: NOTE [the bridge in the kernel] in
:mod:`hpu_runtime.bridge.dispatch`). Measured after it landed
(same machine, shared, 5 rounds of 5,000 ops, bridge off): add 64x64 1.22 µs on CPU tensors,
1.51 µs on hpu tensors; mm 4.06 against 4.34 µs: about 0.3 µs per op. ``--extension`` times
the first prototype's build (it registers a second guard: run it in a process of its own). Run::

    python -m hpu_runtime.tools.bench_device_type [--rounds 5] [--ops 2000] [--extension]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.utils._pytree import tree_map

__all__ = ["HpuWrapper", "measure", "main"]

_HPU = torch.device("hpu", 0)


class HpuWrapper(torch.Tensor):
    """The prototype: a CPU tensor behind a tensor whose ``device`` is ``hpu:0`` (forward only;
    see NOTE [a device type for the simulated Gaudi])."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                  device=_HPU, requires_grad=inner.requires_grad)
        out.inner = inner
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.inner if isinstance(x, HpuWrapper) else x  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: HpuWrapper(x) if type(x) is torch.Tensor else x, out)


def _per_op_us(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure(rounds: int = 5, ops: int = 2000) -> dict[str, dict[str, float]]:
    """Median wall µs per op of each variant (see the module table), ``{variant: {op: us}}``."""
    import hpu_runtime

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    resident = {}
    with hpu_runtime.bridge_disabled():
        wa, wb = HpuWrapper(a.clone()), HpuWrapper(b.clone())
    refs = hpu_runtime.get_device().residency.refs
    base_device = torch._C.TensorBase.device.__get__

    def device_property(t):  # the "device property" candidate's getter
        return _HPU if id(t.untyped_storage()) in refs else base_device(t)

    def cases(on_hpu: bool):
        x, y = (resident["a"], resident["b"]) if on_hpu else (a, b)
        return {"add": lambda: torch.add(x, y), "mm": lambda: torch.mm(x, y)}

    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for variant in ("plain", "hpu", "bridge", "wrapper", "wrapper+bridge", "device property"):
            bridge = variant in ("bridge", "wrapper+bridge")
            (hpu_runtime.activate if bridge else hpu_runtime.deactivate)()
            if variant in ("hpu", "bridge") and not resident:
                resident.update(a=a.to("hpu"), b=b.to("hpu"))
            if variant.startswith("wrapper"):
                fns = {"add": lambda: torch.add(wa, wb), "mm": lambda: torch.mm(wa, wb)}
            elif variant == "device property":
                fns = {"device read": lambda: device_property(a)}
            else:
                fns = {**cases(variant != "plain"), "device read": lambda: a.device}
            for op, fn in fns.items():
                results.setdefault(variant, {}).setdefault(op, []).append(_per_op_us(fn, ops))
            if bridge:
                hpu_runtime.mark_step()
    hpu_runtime.activate()
    return {v: {op: statistics.median(ts) for op, ts in per.items()} for v, per in results.items()}


def _extension_compile_s() -> float:
    """Seconds to compile and load a C++ extension registering a guard for ``hpu`` (prototype)."""
    import tempfile

    from torch.utils.cpp_extension import load_inline

    src = ("#include <torch/extension.h>\n#include <c10/core/impl/FakeGuardImpl.h>\n"
           "namespace { C10_REGISTER_GUARD_IMPL(HPU, c10::impl::FakeGuardImpl<c10::DeviceType::HPU>); }\n"
           "int registered() { return 1; }\n")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        load_inline("hpu_guard_prototype", cpp_sources=src, functions=["registered"], build_directory=d)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.bench_device_type", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000, help="ops timed per variant and round")
    ap.add_argument("--extension", action="store_true", help="also time compiling the C++ guard prototype")
    args = ap.parse_args(argv)
    res = measure(args.rounds, args.ops)
    rows = []
    for variant, per in res.items():
        plain = res["plain"]
        rows.append([variant, *(f"{per[op]:.2f}" if op in per else "" for op in ("add", "mm", "device read")),
                     *(f"{per[op] / plain[op]:.1f}x" if op in per and op in plain else "" for op in ("add", "mm"))])
    print("wall-clock µs per op on this machine (median of rounds; one intra-op thread)")
    print(tabulate(rows, headers=["variant", "add 64x64", "mm 64x64", ".device read", "add vs plain", "mm vs plain"]))
    if args.extension:
        print(f"compiling the C++ guard prototype: {_extension_compile_s():.1f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
