"""Intel's support matrix rows warn once, only in the modes the matrix marks "No"."""

from __future__ import annotations

import warnings

import pytest

from hpu_runtime import reset_device
from hpu_runtime.api import support_matrix


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(support_matrix, "_warned", set())
    yield
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    reset_device()


@pytest.mark.parametrize("lazy, row, warns", [("1", "PyTorch FSDP", True), ("0", "PyTorch FSDP", False),
                                              ("0", "PyTorch Tensor Parallel", True), ("1", "PyTorch Dtensor", True)])
def test_rows_warn_once_in_their_unsupported_modes(fresh, monkeypatch, lazy, row, warns) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    reset_device()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert support_matrix.warn_if_unsupported(row) is warns
        assert support_matrix.warn_if_unsupported(row) is False  # once per process
    assert [str(w.message).split("'")[1] for w in caught] == ([row] if warns else [])
    assert all(issubclass(w.category, support_matrix.GaudiSupportMatrixWarning) for w in caught)


def test_entry_points_are_watched() -> None:
    import torch.distributed.fsdp as fsdp
    import torch.distributed.tensor as dtensor
    import torch.distributed.tensor.parallel as tp

    assert fsdp.fully_shard._gaudi_support_matrix_row == "PyTorch FSDP"
    assert tp.parallelize_module._gaudi_support_matrix_row == "PyTorch Tensor Parallel"
    assert dtensor.DTensor.from_local._gaudi_support_matrix_row == "PyTorch Dtensor"
