"""Real datasets for the reference jobs (all offline; nothing is downloaded).

- ``digits``: the handwritten-digits set bundled with scikit-learn (1,797 real 8 x 8 grey
  images of the digits 0-9, pixel values 0..16), flattened to 64 features.
- ``digits-images``: the same images for image models: normalised (train-split mean and
  std), resized bilinearly to ``image_size`` x ``image_size`` and repeated to 3 channels;
  labels 0-9. Resizing happens per sample, so a 224-px set costs no more memory than 8 px.
- ``text-lm``: next-token examples from the English corpus of :mod:`models.text`
  (byte-level tokens): ``(input_ids, labels)``, each ``(seq_len,)``.
- ``text-mlm``: BERT pretraining examples from the same corpus: ``(input_ids,
  token_type_ids, attention_mask, mlm_labels, nsp_labels)``; see
  :func:`models.text.mlm_examples`.

:func:`write_mnist` writes the digits as an MNIST-format file set (IDX files, 28 x 28 bytes,
as ``torchvision.datasets.MNIST`` reads them from ``<root>/MNIST/raw``), so an MNIST training
script that calls ``datasets.MNIST(root, download=True)`` runs unmodified and offline:
torchvision finds the files and downloads nothing. ``python -m models.data mnist ROOT``.

Splits are deterministic in ``seed``: digits stratified by label; text examples are
disjoint windows of the corpus, shuffled by a seeded permutation before the split.

NOTE [digits split cache]
    The digits split is scikit-learn's (``load_digits`` and ``train_test_split`` stratified by
    label), and importing scikit-learn costs about 1.5 s of CPU per process (it imports SciPy),
    more than the rest of a small job's start-up: every rank of a ``models.train`` job paid it.
    The first process to make a split writes it to ``<cache>/digits-v<format>-sklearn<version>-
    test<f>-seed<s>.npz`` (atomically; NumPy's format, read back without pickle) and later
    processes read it, with no scikit-learn import. The key holds the installed scikit-learn
    version (read from its package metadata, which does not import it) and the format of what
    this module makes of the digits (``_SPLIT_FORMAT``), so a new version of either makes a new
    file. A file that cannot be read or does not hold a well-formed split is made again. The
    cache is ``$HPU_EMULATOR_DATA_CACHE`` if set (``0``: none), else ``hpu_emulator`` in the
    user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``); an unwritable one is skipped.
"""

from __future__ import annotations

import importlib.metadata
import os
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from hpu_runtime.cli_args import count
from hpu_runtime.files import atomic_open, atomic_write

from . import text

__all__ = ["load_dataset", "dataset_names", "DigitsImages", "write_mnist", "MNIST_FILES"]


DATA_CACHE_ENV = "HPU_EMULATOR_DATA_CACHE"
"""A folder for the digits split (NOTE [digits split cache]); ``0``: no cache."""

_SPLIT_KEYS = ("x_train", "x_test", "y_train", "y_test")
_SPLIT_FORMAT = 1
"""What :func:`_digits_arrays` makes of scikit-learn's digits (features / 16 as float32, labels
as int64, stratified): part of the cache's key, so a change to it must bump this."""


def _data_cache_dir() -> Path | None:
    value = os.environ.get(DATA_CACHE_ENV)
    if value == "0":
        return None
    if value:
        return Path(value)
    from torch._appdirs import user_cache_dir  # torch's copy of appdirs: honours XDG_CACHE_HOME

    return Path(user_cache_dir(appname="hpu_emulator"))


def _digits_split_path(test_fraction: float, seed: int) -> Path | None:
    """Where the split is cached, or None (no cache folder, or scikit-learn not installed)."""
    folder = _data_cache_dir()
    if folder is None:
        return None
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return None  # the import below then says what is missing
    return folder / f"digits-v{_SPLIT_FORMAT}-sklearn{version}-test{test_fraction!r}-seed{seed}.npz"


def _read_split(path: Path) -> tuple[np.ndarray, ...] | None:
    """The four arrays of a cached split, or None where the file is missing or malformed."""
    try:
        with np.load(path, allow_pickle=False) as f:
            x_tr, x_te, y_tr, y_te = (f[k] for k in _SPLIT_KEYS)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    well_formed = (x_tr.dtype == x_te.dtype == np.float32 and y_tr.dtype == y_te.dtype == np.int64
                   and x_tr.ndim == x_te.ndim == 2 and x_tr.shape[1] == x_te.shape[1] == 64
                   and y_tr.shape == x_tr.shape[:1] and y_te.shape == x_te.shape[:1] and len(y_te) > 0)
    return (x_tr, x_te, y_tr, y_te) if well_formed else None


def _digits_arrays(test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """scikit-learn's digits, stratified by label: ``(x_train (N, 64) float32 in [0, 1], x_test,
    y_train (N,) int64, y_test)``, cached (NOTE [digits split cache])."""
    path = _digits_split_path(test_fraction, seed)
    if path is not None and (cached := _read_split(path)) is not None:
        return cached
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data.astype(np.float32) / 16.0).reshape(-1, 64)
    y = data.target.astype(np.int64)
    split = tuple(train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(path, "wb") as f:
                np.savez(f, **dict(zip(_SPLIT_KEYS, split)))
        except OSError:
            pass  # an unwritable cache: the next process makes the split again
    return split


def _digits(test_fraction: float, seed: int, **_: int | None) -> tuple[TensorDataset, TensorDataset]:
    x_tr, x_te, y_tr, y_te = _digits_arrays(test_fraction, seed)
    return (
        TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
        TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
    )


class DigitsImages(Dataset):
    """Digits as ``(3, S, S)`` float32 images (normalised, bilinear resize) and int64 labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, image_size: int) -> None:
        self.images = images  # (N, 1, 8, 8), already normalised
        self.labels = labels
        self.image_size = image_size

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = F.interpolate(self.images[i : i + 1], size=(self.image_size, self.image_size),
                            mode="bilinear", align_corners=False)
        return img[0].expand(3, -1, -1).contiguous(), self.labels[i]


def _digits_images(test_fraction: float, seed: int, *, image_size: int | None = None, **_: int | None):
    if image_size is None or image_size < 1:
        raise ValueError(f"dataset 'digits-images' needs image_size >= 1, got {image_size}")
    x_tr, x_te, y_tr, y_te = _digits_arrays(test_fraction, seed)
    mean, std = float(x_tr.mean()), float(x_tr.std())
    # Bilinear weights sum to one, so normalising before the resize equals normalising after.
    norm = lambda a: ((torch.from_numpy(a) - mean) / std).view(-1, 1, 8, 8)  # noqa: E731
    return (DigitsImages(norm(x_tr), torch.from_numpy(y_tr), image_size),
            DigitsImages(norm(x_te), torch.from_numpy(y_te), image_size))


def _split(tensors: tuple[torch.Tensor, ...], test_fraction: float, generator: torch.Generator):
    n = tensors[0].shape[0]
    perm = torch.randperm(n, generator=generator)
    n_test = max(1, int(round(n * test_fraction)))
    te, tr = perm[:n_test], perm[n_test:]
    return TensorDataset(*(t[tr] for t in tensors)), TensorDataset(*(t[te] for t in tensors))


def _check_text_args(name: str, seq_len: int | None, vocab_size: int | None) -> None:
    if seq_len is None or seq_len < 1:
        raise ValueError(f"dataset {name!r} needs seq_len >= 1, got {seq_len}")
    if vocab_size is None:
        raise ValueError(f"dataset {name!r} needs the model's vocab_size")


def _text_lm(test_fraction: float, seed: int, *, seq_len: int | None = None, vocab_size: int | None = None, **_):
    _check_text_args("text-lm", seq_len, vocab_size)
    ids = text.encode(text.corpus_text(), vocab_size)
    g = torch.Generator().manual_seed(seed)
    return _split(text.lm_sequences(ids, seq_len), test_fraction, g)


def _text_mlm(test_fraction: float, seed: int, *, seq_len: int | None = None, vocab_size: int | None = None, **_):
    _check_text_args("text-mlm", seq_len, vocab_size)
    ids = text.encode(text.corpus_text(), vocab_size)
    g = torch.Generator().manual_seed(seed)
    return _split(text.mlm_examples(ids, seq_len, vocab_size, g), test_fraction, g)


_DATASETS = {"digits": _digits, "digits-images": _digits_images, "text-lm": _text_lm, "text-mlm": _text_mlm}


def dataset_names() -> list[str]:
    return sorted(_DATASETS)


def load_dataset(
    name: str,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    image_size: int | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
) -> tuple[Dataset, Dataset]:
    """Train and held-out test splits of dataset ``name`` (deterministic in ``seed``).

    Args:
        image_size: side in pixels (``digits-images`` only).
        seq_len: tokens per example (``text-lm``, ``text-mlm``).
        vocab_size: the model's vocabulary; token ids stay below it (text sets).

    Returns:
        ``(train, test)`` datasets; ``digits``: TensorDatasets of ``(features float32 (N, 64),
        label int64 (N,))``; the others as described in the module docstring.

    Raises:
        ValueError: unknown dataset, a test fraction outside (0, 1), or a missing size.
    """
    if name not in _DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    return _DATASETS[name](test_fraction, seed, image_size=image_size, seq_len=seq_len, vocab_size=vocab_size)


MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
"""The four raw files ``torchvision.datasets.MNIST`` looks for (its resource names minus ``.gz``)."""


def _idx_bytes(array: np.ndarray) -> bytes:
    """One array as an IDX file: magic ``0x0000 08 <ndim>`` (unsigned bytes), big-endian dims, data."""
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return head + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _mnist_images(x: np.ndarray) -> np.ndarray:
    """``(N, 64)`` digits in [0, 1] -> ``(N, 28, 28)`` uint8: resized to 20 x 20 and centred in
    a 4-pixel border, as MNIST's digits are (LeCun et al., "Gradient-based learning applied to
    document recognition", Proc. IEEE 1998)."""
    t = torch.from_numpy(x).view(-1, 1, 8, 8)
    t = F.interpolate(t, size=(20, 20), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    t = F.pad(t, (4, 4, 4, 4))
    return (t[:, 0] * 255.0).round().to(torch.uint8).numpy()


def write_mnist(root: str, *, test_fraction: float = 0.2, seed: int = 0) -> str:
    """Write the digits set as MNIST raw files under ``<root>/MNIST/raw``; return that folder.

    Train and test are the stratified ``digits`` split (1,437 and 360 images at the default
    ``test_fraction``). Images are uint8 28 x 28, labels uint8 0-9. Existing files are
    overwritten (atomically, file by file).
    """
    x_tr, x_te, y_tr, y_te = _digits_arrays(test_fraction, seed)
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    arrays = (_mnist_images(x_tr), y_tr.astype(np.uint8), _mnist_images(x_te), y_te.astype(np.uint8))
    for name, array in zip(MNIST_FILES, arrays):
        atomic_write(os.path.join(raw, name), _idx_bytes(array))
    return raw


def main(argv: list[str] | None = None) -> None:
    """``python -m models.data mnist ROOT``: write the MNIST-format digits set."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m models.data", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mnist", help="write the digits as MNIST raw files under ROOT/MNIST/raw")
    m.add_argument("root")
    m.add_argument("--seed", type=count(0, 2**32 - 1), default=0)
    args = ap.parse_args(argv)
    print(write_mnist(args.root, seed=args.seed))


if __name__ == "__main__":
    main()
