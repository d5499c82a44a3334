"""Every module of the four packages imports, and every import of our own modules, including
those deferred into a function body, names a module that exists (``bench_hpex`` kept a
deferred ``from .device_spec import`` after the planes moved, and failed only when run)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.integration.launch_helpers import REPO, clean_env

_LIST_AND_IMPORT = r"""
import importlib, json, pkgutil, sys, traceback
failed, seen = {}, []
for top in ("hccl", "hpu_runtime", "launchers", "models"):
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


def _imported_modules(file) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import of our packages in ``file``, at any depth."""
    parts = list(file.relative_to(REPO).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, n) for line, n in found if n.split(".")[0] in (*_PACKAGES, "tests")]


def test_every_own_import_names_an_existing_module() -> None:
    missing = []
    for top in (*_PACKAGES, "tests"):
        for file in sorted((REPO / top).rglob("*.py")):
            for line, name in _imported_modules(file):
                if not _module_exists(name):
                    missing.append(f"{file.relative_to(REPO)}:{line}: {name}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


@pytest.mark.timeout(180)
def test_every_module_imports() -> None:
    proc = subprocess.run([sys.executable, "-c", _LIST_AND_IMPORT], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "hpu_runtime.tools.bench_hpex" in report["seen"] and "hccl.transport.executor" in report["seen"]
    assert not report["failed"], "\n".join(f"{k}:\n{v}" for k, v in report["failed"].items())


@pytest.mark.timeout(300)
def test_bench_hpex_prints_its_table_on_debug_models() -> None:
    """The fused optimizers record fewer ops and a shorter simulated step than torch's."""
    proc = subprocess.run([sys.executable, "-m", "hpu_runtime.tools.bench_hpex", "--flavour", "debug"], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in proc.stdout.splitlines()
            if line.split()[:1] in (["resnet50"], ["bert-large"])}
    assert set(rows) == {("resnet50", "sgd"), ("resnet50", "fused-sgd"), ("bert-large", "adamw"),
                         ("bert-large", "fused-adamw"), ("bert-large", "fused-lamb")}
    for base, fused in ((("resnet50", "sgd"), ("resnet50", "fused-sgd")),
                        (("bert-large", "adamw"), ("bert-large", "fused-adamw")),
                        (("bert-large", "adamw"), ("bert-large", "fused-lamb"))):
        ops, step_ms = int(rows[fused][1]), float(rows[fused][3])
        assert ops < int(rows[base][1]) and step_ms < float(rows[base][3]), (base, fused, rows)
