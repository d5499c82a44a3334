"""The import rules of hpu_runtime's planes (device, bridge, api, tools), read from the
source with ``ast`` so they cannot silently rot: each folder's ``__init__`` states them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.source_imports import imports_of as source_imports

PKG = Path(__file__).resolve().parents[2] / "hpu_runtime"
PLANES = ("device", "bridge", "api", "tools")
HABANA_HCCL = "api/habana_frameworks/torch/distributed/hccl.py"

FORBIDDEN = {
    "device": ("hpu_runtime.bridge", "hpu_runtime.api", "hpu_runtime.tools", "hccl", "launchers", "models"),
    "bridge": ("hpu_runtime.api", "hpu_runtime.tools", "hccl", "launchers", "models"),
    "api": ("hpu_runtime.tools", "hccl", "launchers", "models"),
    "tools": ("hccl", "launchers"),
}
"""Per plane, the modules (and everything below them) its files must not import."""

ALLOWED = {
    "bridge": {"*": ("hpu_runtime.api.metrics",)},  # the counters the bridge records into
    "api": {HABANA_HCCL: ("hccl",)},  # Gaudi's torch.distributed.hccl name maps onto hccl
}
"""Exceptions to FORBIDDEN: per plane, per file (``*``: every file), allowed modules."""

ENV_READERS = {"bridge/config.py", "import_hooks.py", HABANA_HCCL, "bridge/device_type.py"}
"""The only files of device/, bridge/ and api/ (and the top level) that read ``os.environ``:
RuntimeConfig, the start-up hook's switch, Gaudi's rank-variable mapping, and the device
type's build folder (torch's ``TORCH_EXTENSIONS_DIR``, read by torch's rule)."""


def _files(plane: str) -> list[Path]:
    return sorted((PKG / plane).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def _is_module(name: str) -> bool:
    if not name.startswith("hpu_runtime"):
        return False
    rel = Path(*name.split(".")[1:])
    return (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file()


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in the file (or in ``source`` as if it were that
    file), at any depth, relative ones resolved; ``from m import n`` is ``m.n`` when that is
    a module, else ``m``."""
    found = []
    for line, base, names in source_imports(path, source=source):
        if not names:
            found.append((line, base))
        for name in names:
            sub = f"{base}.{name}"
            found.append((line, sub if _is_module(sub) else base))
    return found


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _violations(plane: str, path: Path, source: str | None = None) -> list[str]:
    rel = _rel(path)
    allowed = (*ALLOWED.get(plane, {}).get("*", ()), *ALLOWED.get(plane, {}).get(rel, ()))
    return [f"hpu_runtime/{rel}:{line} imports {module}" for line, module in _imports(path, source)
            if any(_under(module, p) for p in FORBIDDEN[plane]) and not any(_under(module, a) for a in allowed)]


@pytest.mark.parametrize("plane", PLANES)
def test_plane_imports_follow_its_rules(plane):
    """No file of a plane imports what the plane's ``__init__`` says it must not."""
    assert [v for path in _files(plane) for v in _violations(plane, path)] == []


@pytest.mark.parametrize("plane", PLANES)
def test_plane_init_states_what_it_owns_and_must_not_import(plane):
    """Each plane's ``__init__`` docstring states its rules and imports nothing itself."""
    init = PKG / plane / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = ast.get_docstring(tree) or ""
    assert "Owns" in doc and "Must not import" in doc, plane
    for prefix in FORBIDDEN[plane]:
        assert f"``{prefix}``" in doc or prefix.replace("hpu_runtime.", "") in doc, (plane, prefix)
    assert _imports(init) == []


def test_the_checker_sees_a_violation():
    """The rule checker itself: forbidden imports, relative or not, at any depth, are
    reported and the allowed exception is not (so a pass means something)."""
    source = ("from ..api import hpu\nfrom ..api import metrics\nimport hccl.topology\n"
              "def f():\n    from ..tools.tracing import trace_step\n")
    bad = _violations("bridge", PKG / "bridge" / "launcher.py", source)
    assert bad == ["hpu_runtime/bridge/launcher.py:1 imports hpu_runtime.api.hpu",
                   "hpu_runtime/bridge/launcher.py:3 imports hccl.topology",
                   "hpu_runtime/bridge/launcher.py:5 imports hpu_runtime.tools.tracing"]
    assert _violations("device", PKG / "device" / "card.py", "from ..bridge import runtime\n") == [
        "hpu_runtime/device/card.py:1 imports hpu_runtime.bridge.runtime"]


def test_metrics_is_a_leaf():
    """``api.metrics`` (the one api module the bridge may import) imports nothing of hpu_runtime."""
    assert [m for _, m in _imports(PKG / "api" / "metrics.py") if _under(m, "hpu_runtime")] == []


def test_import_hooks_use_the_standard_library_only():
    """The start-up hook is loaded by path by the wheel's .pth in every interpreter."""
    top = {m.split(".")[0] for _, m in _imports(PKG / "import_hooks.py")}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top - set(sys.stdlib_module_names)


def _env_reads(path: Path) -> list[int]:
    """Lines reading ``os.environ`` / ``os.getenv`` (assigning ``os.environ[...] = v`` is not a read)."""
    tree = ast.parse(path.read_text())
    stores = {id(t.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Subscript)}
    return [node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and id(node) not in stores)]


def test_environment_is_read_in_one_place():
    """hpu_runtime reads its environment variables in ``RuntimeConfig.from_env`` only."""
    files = [p for plane in ("device", "bridge", "api") for p in _files(plane)] + sorted(PKG.glob("*.py"))
    readers = {_rel(p): lines for p in files if (lines := _env_reads(p)) and _rel(p) not in ENV_READERS}
    assert readers == {}
