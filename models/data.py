"""Real datasets for the reference jobs.

``digits``: the handwritten-digits set bundled with scikit-learn (1,797 real 8 x 8 grey
images of the digits 0-9, pixel values 0..16). Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

__all__ = ["load_dataset", "dataset_names"]


def _digits(test_fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data.astype(np.float32) / 16.0).reshape(-1, 64)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return (
        TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
        TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
    )


_DATASETS = {"digits": _digits}


def dataset_names() -> list[str]:
    return sorted(_DATASETS)


def load_dataset(name: str, *, test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Train and held-out test splits of dataset ``name`` (stratified, deterministic in ``seed``).

    Returns:
        ``(train, test)`` TensorDatasets of ``(features float32 (N, 64), label int64 (N,))``.

    Raises:
        ValueError: unknown dataset or a test fraction outside (0, 1).
    """
    if name not in _DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    return _DATASETS[name](test_fraction, seed)
