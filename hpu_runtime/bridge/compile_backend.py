"""``torch.compile(model, backend="hpu_backend")``: an FX graph is one recipe.

Dynamo traces with the bridge's dispatch mode switched off (the mode declares
``ignore_compile_internals``) and runs the compiled artifact with it on. The artifact runs
the FX graph's ops for real on the CPU inside :meth:`SimDevice.compiled_region`, so the
whole graph is keyed, cached and launched as one recipe with no per-op host cost (a compiled
region does not rebuild its graph every iteration, unlike lazy mode). The backward pass of
a compiled forward runs op by op through the bridge, as Gaudi's eager mode would.

Registration is lazy because importing ``torch._dynamo`` takes about a second: the backend
is registered when ``torch.compile`` is first called (:func:`install` wraps it), or at once
if dynamo is already imported. A package entry point in the ``torch_dynamo_backends`` group
(``hpu_backend = "hpu_runtime.bridge.compile_backend:hpu_backend"``) makes it visible to dynamo
with no import at all.
"""

from __future__ import annotations

import functools
import sys

import torch

from .runtime import get_device

__all__ = ["BACKEND_NAME", "hpu_backend", "install", "register"]

BACKEND_NAME = "hpu_backend"

_registered = False
_installed = False


def hpu_backend(gm: torch.fx.GraphModule, example_inputs, **_options):
    """Dynamo backend: returns a callable running ``gm`` as one simulated recipe."""
    forward = gm.forward

    @functools.wraps(forward)
    def run(*args):
        with get_device().compiled_region("torch.compile"):
            return forward(*args)

    return run


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
