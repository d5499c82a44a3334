"""``habana_frameworks.torch.hpex``: ``optimizers``, ``normalization``, ``experimental``."""
