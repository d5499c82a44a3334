"""The import rules of hccl's planes (the torch face, ``transport/``, ``sim/``, ``tools/``),
read from the source with ``ast``: each folder's ``__init__`` states them, this keeps them true."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.source_imports import imports_of as source_imports

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


def _files(plane: str, pkg: Path) -> list[Path]:
    if plane == "face":
        return sorted(pkg.glob("*.py"))
    return sorted((pkg / plane).rglob("*.py"))


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved; ``from m import n``
    counts as importing both ``m`` and ``m.n``."""
    out = []
    for line, mod, names in source_imports(path, root):
        out.append((line, mod))
        out += [(line, f"{mod}.{n}") for n in names if n != "*"]
    return out


def violations(plane: str, pkg: Path = PKG) -> list[str]:
    bad = []
    for path in _files(plane, pkg):
        allowed = ALLOWED.get(path.relative_to(pkg).as_posix(), ())
        for line, mod in imports_of(path, pkg.parent):
            for banned in (b for b in FORBIDDEN[plane] if b not in allowed):
                if mod == banned or mod.startswith(banned + "."):
                    bad.append(f"{path.relative_to(pkg).as_posix()}:{line} imports {mod}")
    return sorted(set(bad))


@pytest.mark.parametrize("plane", sorted(FORBIDDEN))
def test_plane_imports_only_what_its_docstring_allows(plane):
    assert _files(plane, PKG), plane
    assert violations(plane) == []


def test_the_checker_sees_relative_and_absolute_imports(tmp_path):
    """A forbidden import written either way is reported (the check can fail)."""
    fake = tmp_path / "hccl"
    (fake / "sim").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "process_group.py").write_text("")
    (fake / "sim" / "__init__.py").write_text("")
    (fake / "sim" / "bad.py").write_text("from ..transport import shm\nimport hccl.process_group\nfrom . import planner\n")
    assert violations("sim", fake) == ["sim/bad.py:1 imports hccl.transport", "sim/bad.py:1 imports hccl.transport.shm",
                   "sim/bad.py:2 imports hccl.process_group"]
