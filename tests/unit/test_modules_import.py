"""Every module of the four packages imports, and every import of our own modules, including
those deferred into a function body, names a module that exists (``bench_hpex`` kept a
deferred ``from .device_spec import`` after the planes moved, and failed only when run)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.launch_helpers import run
from tests.source_imports import REPO, imports_of

_LIST_AND_IMPORT = r"""
import importlib, json, pkgutil, sys, traceback
failed, seen = {}, []
for top in sys.argv[1:]:
    pkg = importlib.import_module(top)
    names = [top] + [m.name for m in pkgutil.walk_packages(pkg.__path__, top + ".")]
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs a command when imported
        seen.append(name)
        try:
            importlib.import_module(name)
        except Exception:
            failed[name] = traceback.format_exc(limit=3)
print(json.dumps({"seen": seen, "failed": failed}))
"""

_PACKAGES = ("hccl", "hpu_runtime", "launchers", "models")


def _module_exists(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or path.is_dir()


def test_every_own_import_names_an_existing_module() -> None:
    missing = []
    for top in (*_PACKAGES, "tests"):
        for file in sorted((REPO / top).rglob("*.py")):
            for line, name, _ in imports_of(file):
                if name.split(".")[0] in (*_PACKAGES, "tests") and not _module_exists(name):
                    missing.append(f"{file.relative_to(REPO)}:{line}: {name}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


@pytest.mark.timeout(180)
def test_every_module_imports() -> None:
    proc = run([sys.executable, "-c", _LIST_AND_IMPORT, *_PACKAGES], timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "hpu_runtime.tools.bench_hpex" in report["seen"] and "hccl.transport.executor" in report["seen"]
    assert not report["failed"], "\n".join(f"{k}:\n{v}" for k, v in report["failed"].items())
