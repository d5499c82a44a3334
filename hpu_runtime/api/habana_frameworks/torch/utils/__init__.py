"""``habana_frameworks.torch.utils``: ``library_loader``, ``experimental``, ``debug``, ``distributed_utils``."""
