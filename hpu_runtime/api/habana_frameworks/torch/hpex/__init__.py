"""``habana_frameworks.torch.hpex``: ``optimizers``, ``normalization``, ``kernels``, ``experimental``."""
