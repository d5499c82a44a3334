"""In-tree PEP 517 build backend: setuptools, plus one ``.pth`` file in every wheel it builds.

``pyproject.toml`` names this module as the build backend (``backend-path``). It is
``setuptools.build_meta`` unchanged, except that :func:`build_wheel` and
:func:`build_editable` add ``gaudi_hccl_emulator_habana.pth`` at the root of the wheel (so it
lands in site-packages) and record it in the wheel's ``RECORD``.

The ``.pth`` line runs at interpreter start-up. It locates the installed ``hpu_runtime``
package *without importing it* (``importlib.util.find_spec``), loads only
``hpu_runtime/import_hooks.py`` (standard library only) and calls its ``install()``, which
appends the finder for ``habana_frameworks`` to ``sys.meta_path``. Any failure is swallowed:
a start-up hook must never break an unrelated Python program. See
:mod:`hpu_runtime.import_hooks` for why this mechanism was chosen.

This file is not part of the installed package's runtime; it runs only inside pip's build.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools' own

PTH_NAME = "gaudi_hccl_emulator_habana.pth"

_HOOK = (
    "try:\n"
    " import importlib.util as u\n"
    " s = u.find_spec('hpu_runtime')\n"
    " d = s.submodule_search_locations[0] if s and s.submodule_search_locations else None\n"
    " f = d and u.spec_from_file_location('_hpu_runtime_import_hooks', d + '/import_hooks.py')\n"
    " m = f and u.module_from_spec(f)\n"
    " f and f.loader.exec_module(m)\n"
    " m and m.install()\n"
    "except Exception:\n"
    " pass\n"
)
PTH_LINE = f"import sys; exec({_HOOK!r})\n"
"""The one line of the ``.pth`` file (``site`` executes lines that start with ``import``)."""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def add_pth(wheel_path: str) -> None:
    """Rewrite the wheel at ``wheel_path`` with :data:`PTH_NAME` added and listed in RECORD."""
    data = PTH_LINE.encode()
    fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(wheel_path))
    os.close(fd)
    try:
        with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                if item.filename == PTH_NAME:
                    continue
                body = src.read(item.filename)
                if item.filename.endswith(".dist-info/RECORD"):
                    lines = [ln for ln in body.decode().splitlines(keepends=True) if not ln.startswith(PTH_NAME + ",")]
                    body = "".join([_record_line(PTH_NAME, data), *lines]).encode()
                dst.writestr(item, body)
            dst.writestr(PTH_NAME, data)
        shutil.move(tmp, wheel_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name
