"""Start-up import hooks: ``import habana_frameworks...`` finds the emulator's Gaudi names, and
``import torchvision`` works on the CPU torch wheel, as both do on a user's Gaudi machine.

Gaudi scripts begin with ``import torch, torchvision`` and
``import habana_frameworks.torch.core as htcore``. The emulator's versions of the
``habana_frameworks`` modules live in :mod:`hpu_runtime.api.habana_frameworks` (the fixed
top-level layout has no ``habana_frameworks/`` folder). This module installs three
:class:`importlib.abc.MetaPathFinder` objects, and imports only the standard library:

* :class:`HabanaFrameworksFinder` answers for the top-level name ``habana_frameworks`` with
  that folder (and for ``habana_dataloader``, an import-only placeholder); every submodule is then found by Python's ordinary path finder inside it, so
  each ``habana_frameworks.X`` is a real module file ``hpu_runtime/api/habana_frameworks/X``.
  Those files are thin: they re-export :mod:`hpu_runtime` objects, so state (the device,
  its timeline) exists once however a name is reached.
* The same finder answers ``torch.hpu`` while nothing has registered it: NOTE [the card on
  first use].
* :class:`TorchvisionFinder` wraps the loading of ``torchvision._meta_registrations`` and
  ``torchvision`` only: see :mod:`models._torchvision` (the registry's torchvision 0.28.0
  wheel cannot load its compiled ops with the CPU torch wheel, and its import then fails on
  two op schemas). Before ``_meta_registrations`` runs, the two schemas are defined *if and
  only if* torchvision's own ops did not load; after ``torchvision`` is imported,
  ``torchvision.ops.nms`` is made usable. With a working torchvision nothing changes.
* :class:`AfterImportFinder` wraps the loading of the few modules in :data:`AFTER_IMPORT`
  (optimum-habana's trainer, torch's FSDP / tensor-parallel / DTensor packages): after one
  runs, the emulator's patch for it is applied (simulated-clock throughput figures; support
  matrix warnings). Off with ``HPU_EMULATOR_HABANA_FRAMEWORKS=0``.

NOTE [why finders at the end of sys.meta_path, and who installs them]
* Never shadow a real installation: the ``habana_frameworks`` finder is *appended* to
  ``sys.meta_path``, after Python's own path finder. If a real ``habana_frameworks`` (Intel's ``habana-torch-plugin``)
  is importable, the path finder finds it first and ours is never asked; importing
  :mod:`hpu_runtime` then says once, in a warning, that the real stack is present and the
  emulator's names stepped aside (:func:`warn_if_shadowed`). The torchvision finder only
  ever delegates to the path finder's own spec.
* Work whether or not the script imports torch first: the package's wheel carries a one-line
  ``gaudi_hccl_emulator_habana.pth`` (added by ``hpu_runtime/_packaging/build_backend.py``,
  the in-tree PEP 517 backend that wraps setuptools). ``site`` runs it at interpreter
  start-up; it loads *this file alone* (not the :mod:`hpu_runtime` package, which imports
  torch) and calls :func:`install`. The cost to an unrelated Python process is one small
  file. As a second route ``import hpu_runtime`` installs them too, so a source checkout on
  ``PYTHONPATH`` without the ``.pth`` works once the emulator is imported.
* A registration, nothing more: installing changes no environment variable and imports
  nothing until a program asks for ``habana_frameworks`` or ``torchvision``.
* ``HPU_EMULATOR_HABANA_FRAMEWORKS=0`` makes the ``habana_frameworks`` finder answer nothing
  (read at each lookup, here rather than in ``RuntimeConfig``: this file must import only the
  standard library).
* Where this file lives: at the top of ``hpu_runtime``, outside the planes, because the
  ``.pth`` line loads ``hpu_runtime/import_hooks.py`` by that path; the folders it points at
  are ``hpu_runtime/api/habana_frameworks`` and ``hpu_runtime/api/habana_dataloader``.

NOTE [the card on first use]
Since Intel Gaudi software 1.18, ``import torch`` loads ``habana_frameworks.torch`` through
torch's ``torch.backends`` entry points (Intel's "Intel Gaudi PyTorch Python API" page, "PyTorch
Autoloading"), so a script may use ``.to("hpu")`` without importing anything of Gaudi's. Loading
the emulator at every ``import torch`` would put its bridge (hooks around every aten op)
into every torch process of the environment, Gaudi script or not. It loads on first use
instead: the first time a tensor is created on or moved to ``hpu``, torch initialises the device
by importing ``torch.hpu``; while nothing has registered that module, this finder answers it by
importing ``habana_frameworks.torch`` (the device, ``torch.hpu``, the bridge on the calling
thread, the "hccl" names), before the op that asked runs, so that op is charged as with an
explicit import. The difference from Gaudi: before the first hpu tensor, ``torch.hpu`` is not an
attribute of ``torch`` (``torch.hpu.is_available()`` first still needs the import), and under
``mpirun`` the MPI rank variables are mapped at the first hpu tensor, not at ``import torch``.

Alternatives rejected: shipping a top-level ``habana_frameworks`` package would overwrite or
be overwritten by a real install (both own the same files) and breaks the fixed layout; a
``sitecustomize`` module collides with the user's own; installing the hook only from
``import torch`` (our ``torch.backends`` entry point) fails for scripts that import
``habana_frameworks`` first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

__all__ = [
    "NAME",
    "HabanaFrameworksFinder",
    "AfterImportFinder",
    "TorchvisionFinder",
    "install",
    "installed_finders",
    "real_installation",
    "warn_if_shadowed",
]

NAME = "habana_frameworks"
"""The top-level package name Gaudi scripts import."""

TORCH_HPU = "torch.hpu"
"""The module torch imports to initialise the ``hpu`` device the first time a tensor goes there."""

TOP_LEVEL = ("habana_frameworks", "habana_dataloader")
"""Top-level names the finder answers, each with the folder of that name in ``hpu_runtime/api``."""

SWITCH = "HPU_EMULATOR_HABANA_FRAMEWORKS"
"""Environment variable: ``0`` turns the ``habana_frameworks`` finder off."""

_PKG = os.path.dirname(os.path.abspath(__file__))
_API = os.path.join(_PKG, "api")  # the API plane holds the Gaudi-named folders
_HERE = os.path.join(_API, NAME)
_MARK = "_gaudi_emulator_finder"
_warned = False


class HabanaFrameworksFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level names :data:`TOP_LEVEL` in the folders of those names in ``hpu_runtime/api``.

    Only those names are answered; submodules are found through the package's ``__path__``.
    """

    _gaudi_emulator_finder = "habana_frameworks"

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib protocol
        if os.environ.get(SWITCH, "1") == "0":
            return None
        if fullname == TORCH_HPU:
            return importlib.util.spec_from_loader(fullname, _TorchHpuLoader())
        if fullname not in TOP_LEVEL:
            return None
        folder = os.path.join(_API, fullname)
        init = os.path.join(folder, "__init__.py")
        if not os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[folder])


class _TorchHpuLoader(importlib.abc.Loader):
    """``import torch.hpu`` with nothing registered yet: loads the simulated Gaudi
    (NOTE [the card on first use])."""

    def create_module(self, spec):
        importlib.import_module(NAME + ".torch")
        module = sys.modules.get(TORCH_HPU)
        if module is None:  # pragma: no cover - the import registers it or raises
            raise ModuleNotFoundError(f"{NAME}.torch registered no {TORCH_HPU}", name=TORCH_HPU)
        return module

    def exec_module(self, module) -> None:
        """Nothing: the module returned by :meth:`create_module` is already executed."""


class _WrappedLoader(importlib.abc.Loader):
    """Runs ``before(name)`` / ``after(module)`` around another loader's ``exec_module``."""

    def __init__(self, inner, before=None, after=None) -> None:
        self.inner, self.before, self.after = inner, before, after

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        if self.before is not None:
            self.before()
        self.inner.exec_module(module)
        if self.after is not None:
            self.after(module)

    def __getattr__(self, name):  # get_source, get_code, is_package... as the inner loader
        return getattr(self.inner, name)


_TV_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "_torchvision.py")
_TV_NAME = "_hpu_runtime_torchvision_compat"


def _torchvision_compat():
    """Our ``models/_torchvision.py``, loaded by path: a user's own ``models`` package (common
    in training repositories) must neither hide it nor be imported by it."""
    mod = sys.modules.get(_TV_NAME)
    if mod is None:
        spec = importlib.util.spec_from_file_location(_TV_NAME, _TV_FILE)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_TV_NAME] = mod
        spec.loader.exec_module(mod)
    return mod


class TorchvisionFinder(importlib.abc.MetaPathFinder):
    """Lets ``import torchvision`` succeed when its compiled ops cannot load (see module doc)."""

    _gaudi_emulator_finder = "torchvision"

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib protocol
        if fullname not in ("torchvision", "torchvision._meta_registrations"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not os.path.isfile(_TV_FILE):
            return None
        if fullname == "torchvision":
            spec.loader = _WrappedLoader(spec.loader, after=lambda tv: _torchvision_compat().after_import(tv))
        else:
            spec.loader = _WrappedLoader(spec.loader, before=lambda: _torchvision_compat().define_missing_schemas())
        return spec


class AfterImportFinder(importlib.abc.MetaPathFinder):
    """After one of :data:`AFTER_IMPORT`'s modules loads, hand it to the emulator's patch for it:
    optimum-habana's trainer, its generation timer and diffusers pipelines, and transformers'
    Trainer read the simulated clock
    (:mod:`hpu_runtime.api.optimum_clock`); inductor refuses hpu graphs with an error naming
    ``hpu_backend`` (:func:`hpu_runtime.bridge.compile_backend.refuse_hpu_in_inductor`);
    FSDP, tensor-parallel and DTensor entry points warn where Intel's support matrix marks them
    unsupported (:mod:`hpu_runtime.api.support_matrix`). The torch modules are patched only in
    a process that has imported ``hpu_runtime`` (no simulated Gaudi, nothing to say);
    ``import hpu_runtime`` patches those already imported."""

    _gaudi_emulator_finder = "after_import"

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib protocol
        entry = AFTER_IMPORT.get(fullname)
        if entry is None:
            entry = next((e for prefix, e in AFTER_IMPORT_UNDER.items() if fullname.startswith(prefix)), None)
        if entry is None or os.environ.get(SWITCH, "1") == "0":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        patcher, needs_emulator = entry

        def after(module) -> None:
            if needs_emulator and "hpu_runtime" not in sys.modules:
                return
            _apply(patcher, module)

        spec.loader = _WrappedLoader(spec.loader, after=after)
        return spec


def _apply(patcher: str, module) -> None:
    """Call ``patcher`` (``"module:function"``) on ``module``."""
    mod_name, _, fn = patcher.partition(":")
    getattr(importlib.import_module(mod_name), fn)(module)


def patch_imported() -> None:
    """Apply the patches of the :data:`AFTER_IMPORT` modules that need the emulator to those
    already imported: imported before ``hpu_runtime``, the hook left them as they were
    (``import hpu_runtime`` calls this; every patch is idempotent)."""
    for name, (patcher, needs_emulator) in AFTER_IMPORT.items():
        module = sys.modules.get(name)
        if needs_emulator and module is not None:
            _apply(patcher, module)


AFTER_IMPORT = {
    "optimum.habana.transformers.trainer": ("hpu_runtime.api.optimum_clock:patch_trainer_module", False),
    "optimum.habana.utils.misc": ("hpu_runtime.api.optimum_clock:patch_misc_module", False),
    "transformers.trainer": ("hpu_runtime.api.optimum_clock:patch_transformers_trainer", True),
    "torch._inductor.compile_fx": ("hpu_runtime.bridge.compile_backend:refuse_hpu_in_inductor", True),
    "torch.distributed.fsdp": ("hpu_runtime.api.support_matrix:patch_module", True),
    "torch.distributed.tensor": ("hpu_runtime.api.support_matrix:patch_module", True),
    "torch.distributed.tensor.parallel": ("hpu_runtime.api.support_matrix:patch_module", True),
}
"""Module -> (``module:function`` that patches it, only if ``hpu_runtime`` is imported)."""

AFTER_IMPORT_UNDER = {
    "optimum.habana.diffusers.pipelines.": ("hpu_runtime.api.optimum_clock:patch_pipeline_module", False),
}
"""Package prefix -> the same, for every module under it."""


def installed_finders() -> dict[str, importlib.abc.MetaPathFinder]:
    """The emulator's finders in ``sys.meta_path``, by what they find."""
    return {getattr(f, _MARK): f for f in sys.meta_path if isinstance(getattr(f, _MARK, None), str)}


def install() -> None:
    """Add the finders to ``sys.meta_path`` once per interpreter (idempotent, cheap)."""
    have = installed_finders()
    if "habana_frameworks" not in have:
        sys.meta_path.append(HabanaFrameworksFinder())  # last: any real install wins
    if "torchvision" not in have:
        sys.meta_path.insert(0, TorchvisionFinder())  # first: it wraps the path finder's own spec
    if "after_import" not in have:
        sys.meta_path.insert(0, AfterImportFinder())  # first, for the same reason


def _ours(where: str | None) -> bool:
    return where is not None and os.path.abspath(where).startswith(_HERE)


def real_installation() -> str | None:
    """Where a real (not the emulator's) ``habana_frameworks`` is importable from, or None.

    Asks only Python's path finder (our finder is skipped) and imports nothing.
    """
    mod = sys.modules.get(NAME)
    if mod is not None:
        where = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", [])), None)
        return None if _ours(where) else (where or NAME)
    spec = importlib.machinery.PathFinder.find_spec(NAME)
    if spec is None:
        return None
    where = spec.origin if spec.origin not in (None, "namespace") else next(iter(spec.submodule_search_locations or []), None)
    return None if _ours(where) else (where or NAME)


def warn_if_shadowed() -> str | None:
    """Warn once per process if a real ``habana_frameworks`` is importable; return its location."""
    global _warned
    where = real_installation()
    if where is not None and not _warned:
        _warned = True
        warnings.warn(f"hpu_runtime: a real habana_frameworks is installed ({where}); the emulator's "
                      "habana_frameworks names step aside and scripts will import the real Gaudi stack",
                      stacklevel=2)
    return where
