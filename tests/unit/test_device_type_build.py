"""Where the ``hpu`` device type's C++ extension is built, and the error without a compiler
(hpu_runtime.bridge.device_type; the build itself runs at the first ``import hpu_runtime``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from hpu_runtime.bridge import device_type


def test_the_library_is_under_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    so = device_type.library_path()
    assert so.parent.parent == tmp_path and so.parent.is_dir() and so.name == f"{so.parent.name}.so"


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
