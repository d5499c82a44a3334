"""``torch.compile(model, backend="hpu_backend")``: forward and backward graphs, one recipe each.

NOTE [compiled regions]
As Gaudi's ``hpu_backend``, the backend hands dynamo's FX graph to AOTAutograd, which
traces the forward and the backward into two aten graphs (functionalized, partitioned on
what backward needs). Each graph becomes a *compiled region* (:meth:`SimDevice.compiled_region`):
its ops run for real on the CPU with the bridge on, accumulate with no per-op host cost
(a compiled graph is not rebuilt every iteration, unlike lazy mode) and launch together
as one recipe, keyed by its ops (NOTE [graph key]): the first run compiles it (charged on
the host), later runs hit the recipe cache, and what makes dynamo recompile (a guard
failure: a new shape, a new Python constant) gives a new graph and so a new compile.
Everything outside the compiled regions (the loss when not compiled, DDP's reducer copies,
the optimizer) runs as the device's mode says: op by op in eager mode
(``PT_HPU_LAZY_MODE=0``, where Gaudi supports ``hpu_backend``), accumulated in lazy mode.

Under ``torch.compile(DDP(model))`` dynamo's DDPOptimizer
(``torch/_dynamo/backends/distributed.py``) splits the forward graph at DDP's bucket
boundaries and compiles each piece with this backend: each piece has its own forward and
backward region, so a bucket's gradients are ready (and its allreduce starts on the
collective stream) while the earlier pieces' backward regions still run, as on Gaudi. A
collective issued inside a region (compiled autograd's, see
:mod:`habana_frameworks.torch.dynamo.compile_backend.experimental`) launches the ops
before it, as any collective launches the graph producing its input.

Dynamo traces on fake tensors, which never reach the hpu kernel and its hooks, so compiling
charges nothing; the compiled artifact's real ops go through the kernel and are charged
(NOTE [the bridge in the kernel] in :mod:`hpu_runtime.bridge.dispatch`). The tracer's dispatch
mode over fake tensors declares ``ignore_compile_internals``, so dynamo compiles with it on
the stack.

``torch.compile``'s default backend, inductor, has no hpu code generator: Intel's PyTorch
support matrix lists ``torch.compile(backend="inductor")`` as unsupported on Gaudi and says the
backend "must be set as hpu_backend". Given hpu tensors, inductor would fail deep in its code
generation (``KeyError: 'hpu'``); :func:`refuse_hpu_in_inductor` makes that a clear error
instead, before inductor does any work, naming ``backend="hpu_backend"``. Inductor on CPU
tensors is left as it is.

Registration is lazy because importing ``torch._dynamo`` takes about a second: the backend
is registered when ``torch.compile`` is first called (:func:`install` wraps it), or at once
if dynamo is already imported. A package entry point in the ``torch_dynamo_backends`` group
(``hpu_backend = "hpu_runtime.bridge.compile_backend:hpu_backend"``) makes it visible to dynamo
with no import at all.
"""

from __future__ import annotations

import functools
import sys
import warnings

import torch

from .runtime import get_device

__all__ = ["BACKEND_NAME", "FORWARD", "BACKWARD", "hpu_backend", "install", "register", "refuse_hpu_in_inductor"]

BACKEND_NAME = "hpu_backend"
FORWARD = "torch.compile forward"
"""Label of a forward (or inference) region, in traces and graph logs."""
BACKWARD = "torch.compile backward"
"""Label of a backward region."""

_registered = False
_installed = False
_warned_lazy = False


def _region(label: str):
    """An AOTAutograd compiler: the aten graph runs as one compiled region named ``label``."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        forward = gm.forward
        ca = sys.modules.get("torch._dynamo.compiled_autograd")
        name = BACKWARD if ca is not None and ca.in_compiled_autograd_region else label  # compiled autograd

        def run(args: list):
            with get_device().compiled_region(name):
                return forward(*args)

        run._boxed_call = True  # AOTAutograd passes the arguments as one list
        return run

    return compile_graph


_COMPILERS = {"fw_compiler": _region(FORWARD), "bw_compiler": _region(BACKWARD),
              "inference_compiler": _region(FORWARD),
              "keep_inference_input_mutations": True}  # in-place updates stay in the recipe


def hpu_backend(gm: torch.fx.GraphModule, example_inputs, **_options):
    """Dynamo backend: forward and backward through AOTAutograd, each graph one simulated
    recipe (NOTE [compiled regions]). Options (``torch.compile(options=...)``, e.g. Gaudi's
    ``inference``, ``keep_input_mutations``) are accepted and ignored.

    Warns once when the device is in lazy mode: Gaudi's support matrix runs ``hpu_backend``
    with ``PT_HPU_LAZY_MODE=0`` only (row "torch.compile(backend="hpu_backend")"); here the
    ops outside compiled regions then accumulate as lazy mode does.
    """
    global _warned_lazy
    from torch._dynamo.backends.common import aot_autograd

    if get_device().lazy and not _warned_lazy:
        _warned_lazy = True
        warnings.warn('hpu_backend in lazy mode: the Gaudi PyTorch support matrix lists torch.compile(backend='
                      '"hpu_backend") for PT_HPU_LAZY_MODE=0 only; set PT_HPU_LAZY_MODE=0 to run as Gaudi does',
                      stacklevel=2)
    return aot_autograd(**_COMPILERS)(gm, example_inputs)


def register() -> None:
    """Register ``"hpu_backend"`` with dynamo (imports ``torch._dynamo``; idempotent)."""
    global _registered
    if _registered:
        return
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if BACKEND_NAME not in _BACKENDS or _BACKENDS[BACKEND_NAME] is None:
        register_backend(hpu_backend, name=BACKEND_NAME)
    _registered = True


def install() -> None:
    """Make ``torch.compile(..., backend="hpu_backend")`` work (idempotent, cheap)."""
    global _installed
    if _installed:
        return
    _installed = True
    if "torch._dynamo" in sys.modules:
        register()
        return
    original = torch.compile

    @functools.wraps(original)
    def compile(*args, **kwargs):  # noqa: A001 - mirrors torch.compile
        if not _registered:
            register()
        return original(*args, **kwargs)

    torch.compile = compile


_INDUCTOR_ON_HPU = ('torch.compile: inductor (torch.compile\'s default backend) does not compile for hpu: the Intel '
                    'Gaudi PyTorch support matrix lists torch.compile(backend="inductor") as unsupported; compile '
                    'with torch.compile(model, backend="hpu_backend")')


def refuse_hpu_in_inductor(module) -> None:
    """Wrap ``torch._inductor.compile_fx.compile_fx`` (``module``) so a graph with an hpu input
    raises a ``RuntimeError`` naming ``backend="hpu_backend"`` before inductor starts;
    idempotent. Called by :mod:`hpu_runtime.import_hooks` when that module is imported in a
    process running the emulator, or at ``import hpu_runtime`` if it already was."""
    original = getattr(module, "compile_fx", None)
    if original is None or getattr(original, "_refuses_hpu", False):
        return

    @functools.wraps(original)
    def compile_fx(model_, example_inputs_, *args, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "hpu" for t in example_inputs_):
            raise RuntimeError(_INDUCTOR_ON_HPU)
        return original(model_, example_inputs_, *args, **kwargs)

    compile_fx._refuses_hpu = True
    module.compile_fx = compile_fx
