"""``habana_dataloader``: Gaudi's media-accelerated data loader, as its fallback.

Found as a top-level module by :mod:`hpu_runtime.import_hooks` when no real one is installed.
Intel's ``HabanaDataLoader(dataset, batch_size=, sampler=, num_workers=, pin_memory=, drop_last=)``
(Intel Gaudi docs, "Intel Gaudi Media Loader") decodes and augments on Gaudi 2's media engine
when the dataset and parameters are eligible, and otherwise falls back to a loader on the host.
The simulated Gaudi has no media engine, so here it is always that fallback: torch's
``DataLoader`` with the same arguments, the same batches in the same order (Model-References'
GPU-migration torchvision ``train.py`` builds it by default, ``--dl-worker-type HABANA``).
Its media-pipe internals (``aeon_config``, ``habana_dataset``...) are absent: Habana's ResNet-50
``data_loaders.py`` imports them inside a ``try`` and falls back to torch's loader, and
lightning-habana only requires that the module imports.
"""

from torch.utils.data import DataLoader as _DataLoader

__all__ = ["HabanaDataLoader"]


class HabanaDataLoader(_DataLoader):
    """Intel's loader as its host fallback: exactly ``torch.utils.data.DataLoader`` (same
    arguments, same errors)."""
