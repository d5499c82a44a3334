"""``habana_dataloader``: Gaudi's accelerated data loader, NOT emulated (import-only placeholder).

Found as a top-level module by :mod:`hpu_runtime.import_hooks` when no real one is installed.
lightning-habana requires that it can be imported; Habana's ResNet-50 ``data_loaders.py``
imports ``habana_dataloader.aeon_config`` etc. inside a ``try`` and falls back to
``torch.utils.data.DataLoader`` when they are missing, which is what happens here.
"""
