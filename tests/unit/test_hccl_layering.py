"""The import rules of hccl's planes (the torch face, ``transport/``, ``sim/``, ``tools/``),
read from the source with ``ast``: each folder's ``__init__`` states them, this keeps them true."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hccl"
FACE = tuple(f"hccl.{p.stem}" for p in PKG.glob("*.py") if p.stem != "__init__")
"""The torch face: the modules at the top of the package."""

FORBIDDEN = {
    "sim": ("torch.distributed", "hccl.transport", "hccl.tools", "launchers", "models") + FACE,
    "transport": ("hccl.sim", "hccl.tools", "hpu_runtime", "launchers", "models") + FACE,
    "face": ("hccl.tools", "launchers", "models"),
}
"""Per plane, the modules (and everything below them) its files must not import."""

ALLOWED = {"sim/ddp_plan.py": ("torch.distributed",)}
"""Exceptions, per file: the DDP step plan takes torch's own bucket assignment
(``dist._compute_bucket_assignment_by_size``) and defaults; it opens no process group."""


def _files(plane: str) -> list[Path]:
    if plane == "face":
        return sorted(PKG.glob("*.py"))
    return sorted((PKG / plane).rglob("*.py"))


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
    return out


def violations(plane: str) -> list[str]:
    bad = []
    for path in _files(plane):
        allowed = ALLOWED.get(path.relative_to(PKG).as_posix(), ())
        for line, mod in imports_of(path):
            for banned in (b for b in FORBIDDEN[plane] if b not in allowed):
                if mod == banned or mod.startswith(banned + "."):
                    bad.append(f"{path.relative_to(PKG).as_posix()}:{line} imports {mod}")
    return sorted(set(bad))


@pytest.mark.parametrize("plane", sorted(FORBIDDEN))
def test_plane_imports_only_what_its_docstring_allows(plane):
    assert _files(plane), plane
    assert violations(plane) == []


def test_the_checker_sees_relative_and_absolute_imports(tmp_path):
    """A forbidden import written either way is reported (the check can fail)."""
    fake = tmp_path / "hccl"
    (fake / "sim").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "process_group.py").write_text("")
    (fake / "sim" / "__init__.py").write_text("")
    (fake / "sim" / "bad.py").write_text("from ..transport import shm\nimport hccl.process_group\nfrom . import planner\n")
    globals()["PKG"] = fake
    try:
        got = violations("sim")
    finally:
        globals()["PKG"] = Path(__file__).resolve().parents[2] / "hccl"
    assert got == ["sim/bad.py:1 imports hccl.transport", "sim/bad.py:1 imports hccl.transport.shm",
                   "sim/bad.py:2 imports hccl.process_group"]
