"""``habana_frameworks.torch.hpex``: ``optimizers``, ``normalization``, ``movingavrg``, ``kernels``, ``experimental``."""
