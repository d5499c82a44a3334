"""Which ``habana_frameworks`` names an installed package uses, and what the emulator does with each.

Scans the package's source (``ast``: imports of ``habana_frameworks...`` with their aliases,
attribute chains on those aliases, ``torch.hpu.X`` and ``torch.ops.hpu.X``), then resolves
every name in this process (the emulator's ``habana_frameworks``, ``torch.hpu``,
``torch.ops.hpu``) and prints a table: name, places used, status (``provided``, ``refuses``
for names defined only to raise an error that names them, ``missing``)::

    python -m hpu_runtime.tools.habana_names optimum.habana [--markdown]
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import importlib.util
import sys
from pathlib import Path

__all__ = ["scan", "resolve", "table", "main"]

_REFUSED = {f"torch.ops.hpu.{n}": "fp8/int4 quantized compute is not modelled"
            for n in ("cast_to_fp8_just_in_time", "fp8_gemm_v2", "convert_from_uint4")}


def _chain(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def scan(package: str) -> collections.Counter:
    """``{name: places}`` of every ``habana_frameworks`` / ``torch.hpu`` / ``torch.ops.hpu`` name
    used in ``package``'s ``.py`` files (an attribute chain counts at each of its levels)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not an installed package")
    uses: collections.Counter = collections.Counter()
    for file in sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.py")):
        try:
            tree = ast.parse(file.read_text(errors="replace"))
        except SyntaxError:
            continue
        alias = {"torch": "torch"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("habana_frameworks"):
                        alias[a.asname or "habana_frameworks"] = a.name if a.asname else "habana_frameworks"
                        uses[a.name] += 1
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("habana_frameworks"):
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
                    uses[f"{node.module}.{a.name}"] += 1
        for node in ast.walk(tree):
            chain = _chain(node) if isinstance(node, ast.Attribute) else None
            if not chain or chain[0] not in alias:
                continue
            name = ".".join([alias[chain[0]], *chain[1:]])
            if alias[chain[0]] == "torch":
                if not name.startswith(("torch.hpu.", "torch.ops.hpu.")):
                    continue
                name = ".".join(name.split(".")[:4 if name.startswith("torch.ops.") else 3])
            uses[name] += 1
    return uses


def resolve(name: str) -> str:
    """``provided``, ``refuses: why`` or ``missing: error`` for a dotted name in this process."""
    import torch

    import hpu_runtime  # noqa: F401 - the emulator's names

    if name in _REFUSED:
        return f"refuses (NotImplementedError naming it): {_REFUSED[name]}"
    parts = name.split(".")
    try:
        if parts[0] == "torch":
            obj = torch
            for p in parts[1:]:
                obj = getattr(obj, p)
            return "provided"
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for p in parts[i:]:
                obj = getattr(obj, p)
            return "provided"
        return "missing: no such module"
    except (AttributeError, ImportError) as exc:
        return f"missing: {exc}"


def table(package: str) -> list[tuple[str, int, str]]:
    """``(name, places, status)`` rows, sorted by name."""
    return [(name, n, resolve(name)) for name, n in sorted(scan(package).items())]


def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.habana_names", description=__doc__.splitlines()[0])
    ap.add_argument("package", help="an installed package, e.g. optimum.habana")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    rows = table(args.package)
    print(tabulate(rows, headers=["name", "places", "status"], tablefmt="github" if args.markdown else "simple"))
    missing = sum(r[2].startswith("missing") for r in rows)
    print(f"{len(rows)} names, {sum(r[1] for r in rows)} places; {missing} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
