"""Where the ``hpu`` device type's C++ extension is built, and the error without a compiler
(hpu_runtime.bridge.device_type; the build itself runs at the first ``import hpu_runtime``)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpu_runtime.bridge import device_type


def test_the_library_is_under_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    so = device_type.library_path()
    assert so.parent.parent == tmp_path and so.parent.is_dir() and so.name == f"{so.parent.name}.so"


def test_the_library_is_where_torch_builds_extensions(monkeypatch, tmp_path):
    """Without TORCH_EXTENSIONS_DIR the folder is torch's own for an extension of that name
    (``torch.utils.cpp_extension._get_build_directory``, the reference)."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    so = device_type.library_path()
    from torch.utils.cpp_extension import _get_build_directory

    assert so.parent == Path(_get_build_directory(so.stem, verbose=False))


def test_importing_hpu_runtime_leaves_torchs_build_tools_unimported():
    """Once built, loading the library imports neither ``torch.utils.cpp_extension`` nor
    setuptools (about 0.04 s of CPU of every rank and test process)."""
    device_type.install()  # built (this process imported hpu_runtime): the subprocess only loads it
    code = "import sys, hpu_runtime; print(sorted({'torch.utils.cpp_extension', 'setuptools'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_an_unwritable_cache_falls_back_to_the_temporary_directory(monkeypatch, tmp_path):
    """torch's per-user cache cannot be created (XDG_CACHE_HOME under a regular file): the
    build goes to a per-user folder of the temporary directory instead of failing."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file" / "cache"))
    so = device_type.library_path()
    assert Path(tempfile.gettempdir()) in so.parents and so.parent.parent.name.startswith("hpu_runtime_extensions_")


def test_no_compiler_is_an_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    so = device_type.library_path()
    with pytest.raises(device_type.DeviceTypeBuildError, match=r"C\+\+ compiler .*no-such-g\+\+"):
        device_type._build(so)
    assert not so.exists()
