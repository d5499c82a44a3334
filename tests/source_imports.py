"""The imports a Python file makes, read from its source with ``ast`` (no import runs).

Shared by the plane rules (``tests/unit/test_layering.py``, ``tests/unit/test_hccl_layering.py``)
and the import check of ``tests/unit/test_modules_import.py``; each applies its own rule to
what :func:`imports_of` finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["REPO", "imports_of", "module_name"]

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = REPO) -> str:
    """The dotted module of ``path`` (a ``.py`` file under ``root``); a package's ``__init__``
    is the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = REPO, source: str | None = None) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, module, names)`` of every import statement in ``path`` (or in ``source`` read
    as if it were that file), at any depth (function bodies included).

    ``import a.b`` gives ``(line, "a.b", ())``; ``from X import n1, n2`` gives
    ``(line, X, ("n1", "n2"))`` with a relative ``X`` resolved against the file's package.
    """
    text = path.read_text() if source is None else source
    package = module_name(path, root) if path.name == "__init__.py" else module_name(path, root).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base, tuple(alias.name for alias in node.names)))
    return found
